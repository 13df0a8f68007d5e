"""`speedgpt sft BASE_RUN`: fine-tune a base run into a chat model (speedgpt/chat/sft.py)."""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from pathlib import Path

from ..argv import Parser, refuse_empty_paths

SFT_EPILOG = """\
data: JSONL or Parquet with {"messages": [{"role": "user"|"assistant"|"system", "content": ...}, ...]} per
line/row; several files mixed by weight as FILE:WEIGHT (2: read twice per epoch, 0.5: its first half).
Without --data: built-in tasks (arithmetic, spelling, letter counting), made locally.
The base run's config is inherited (batch, lrs, schedule); override any key as --section.key=value.
examples:
  speedgpt sft runs/base                              # built-in tasks, into runs/base-sft-<time>
  speedgpt sft runs/base --data chats.jsonl --data more.parquet:0.5 --train.steps=300
  speedgpt sft runs/base --load-optimizer --optim.muon_lr=0.01
  speedgpt sft --resume runs/base-sft-x               # continue from its latest checkpoint
  speedgpt sft --resume runs/base-sft-x --train.steps=600 --extend   # fine-tune a finished run further
then: speedgpt chat RUN, speedgpt eval RUN --chat
"""


def cmd_sft(argv: list[str]) -> int:
    p = Parser(prog="speedgpt sft", epilog=SFT_EPILOG, description="Supervised fine-tuning of a "
               "base run on conversations: loss on the assistant's tokens only.",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base_run", nargs="?", metavar="BASE_RUN", help="the run directory of `speedgpt train`")
    p.add_argument("--data", action="append", default=[], metavar="FILE[:WEIGHT]",
                   help="conversations (.jsonl/.parquet); repeat to mix files (default: the built-in tasks)")
    p.add_argument("--run-dir", help="where to write the SFT run (default runs/<base name>-sft-<time>)")
    p.add_argument("--resume", metavar="SFT_RUN", help="continue an SFT run from its latest checkpoint")
    p.add_argument("--extend", action="store_true",
                   help="with --resume: accept a changed train.steps, schedule or optimizer value (as `speedgpt train "
                        "--resume --extend`), e.g. to fine-tune a finished run further")
    p.add_argument("--load-optimizer", action="store_true",
                   help="warm-start the optimizer state from the base run's latest checkpoint")
    p.add_argument("--eval-examples", type=int, default=None,
                   help="held-out examples per built-in task scored by exact match at each eval, 0..100 (default 50)")
    args, overrides = p.parse_known_args(argv)
    refuse_empty_paths(p, args, ("--run-dir", "--resume"))
    bad = [o for o in overrides if not o.startswith("--") or "=" not in o or "." not in o.split("=", 1)[0]]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)} (config overrides look like --train.steps=200)")
    keys = [o.split("=", 1)[0] for o in overrides]  # every override's key, as --section.key
    # The chat model is the base run's model (its weights' shapes and function), trained in one process: a model.* or
    # parallel.* override would be refused deep in the weights' loading, or silently ignored.
    fixed_keys = [k for k in keys if k.startswith(("--model.", "--parallel."))]
    if fixed_keys:
        p.error(f"{', '.join(fixed_keys)}: sft fine-tunes the base run's model (model.*) in one process (parallel.*); "
                f"drop the override (to change the model, train a base run with it)")
    # SFT reads conversations (--data FILE), not the shards: of data.*, only data.seq_len (its rows) applies. Another
    # was written into config.toml and ignored: `--data.train_files=chats.jsonl` fine-tuned on the built-in tasks,
    # exit 0
    unread = [k for k in keys if k.startswith("--data.") and k != "--data.seq_len"]
    if unread:
        p.error(f"{', '.join(unread)}: sft reads conversations from --data FILE, not the shards of data.* (of which "
                f"only data.seq_len applies); drop the override")
    run_keys = [k for k in keys if k.startswith("--run.")]
    if run_keys:  # none is read: `--run.dir=X` trained into the default directory, `--run.wandb=true` logged nowhere
        p.error(f"{', '.join(run_keys)}: sft writes no report, sample, TensorBoard or W&B log, and takes its directory "
                f"from --run-dir; drop the override")
    from ..chat.sft import UNREAD_TRAIN_KEYS

    unread = [k for k in keys if k.removeprefix("--train.") in UNREAD_TRAIN_KEYS]
    if unread:
        p.error(f"{', '.join(unread)}: sft does not apply it (one process, eager, train.steps steps, checkpoints by "
                f"train.checkpoint_every, a non-finite step stops it); drop the override")
    if bool(args.base_run) == bool(args.resume):
        p.error("give BASE_RUN to start an SFT run, or --resume SFT_RUN to continue one")
    fixed = [flag for flag, given in (("--data", args.data), ("--load-optimizer", args.load_optimizer),
                                      ("--eval-examples", args.eval_examples is not None)) if given]
    if args.resume and (fixed or args.run_dir):
        p.error(f"--resume continues the run with its own data and settings (its sft.json): "
                f"{', '.join(fixed + ['--run-dir'] * bool(args.run_dir))} belong to a new SFT run (give BASE_RUN)")
    if args.extend and not args.resume:
        p.error("--extend goes with --resume SFT_RUN (a new run takes its steps and schedule from the overrides)")
    if args.eval_examples is None:
        from ..chat.sft import SFTSpec

        args.eval_examples = SFTSpec.eval_examples
    from ..chat.tasks import heldout_count_problem

    problem = heldout_count_problem("--eval-examples", args.eval_examples)
    if problem:
        p.error(problem)

    from ..config import ConfigError
    from ..outdir import OutDirError
    from ..rundir.checkpoint import CheckpointError
    from ..rundir.lock import RunLocked, lock_run_dir
    from ..rundir.reuse import RunDirInUse, prepare_new_run_dir
    from ..rundir.weights import LoadError
    from ..chat.sft import SPEC_FILE, SFTSpec, sft
    from ..train.guard import NonFiniteError
    from ..train.preempt import TrainingStopped
    from ..train.resume import RunComplete

    run_dir = args.resume or args.run_dir or str(
        Path("runs") / f"{Path(args.base_run).resolve().name}-sft-{time.strftime('%Y%m%d-%H%M%S')}")
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(lock_run_dir(run_dir, flag="--resume" if args.resume else "--run-dir",
                                            notice=lambda line: print(f"speedgpt sft: {line}", file=sys.stderr)))
            if not args.resume:
                try:
                    prepare_new_run_dir(run_dir, overwrite=False)
                except RunDirInUse:  # sft has no --overwrite: a run there is kept
                    if not (Path(run_dir) / SPEC_FILE).is_file():  # `sft --resume` of it would say "no SFT run"
                        raise RunDirInUse(f"{run_dir} already holds a run of `speedgpt train`; pick a fresh "
                                          f"--run-dir for the SFT run") from None
                    raise RunDirInUse(f"{run_dir} already holds a run; continue an SFT run there with `speedgpt sft "
                                      f"--resume {run_dir}` (one stopped before its first checkpoint starts again), "
                                      f"or pick a fresh --run-dir") from None
            spec = None if args.resume else SFTSpec(args.base_run, list(args.data), args.load_optimizer,
                                                    eval_examples=args.eval_examples)
            sft(args.base_run, run_dir, overrides, spec=spec, resume=bool(args.resume), extend=args.extend)
        except RunComplete as e:  # nothing to train: not an error, as for `speedgpt train --resume`
            print(f"speedgpt sft: {e}".replace("speedgpt train --resume", "speedgpt sft --resume"))
            return 0
        except TrainingStopped as e:  # SIGTERM / Ctrl-C: saved, `speedgpt sft --resume RUN` continues
            print(f"speedgpt sft: {e}".replace("speedgpt train --resume", "speedgpt sft --resume"), file=sys.stderr)
            return e.exit_code
        except NonFiniteError as e:  # nothing of the bad step was applied or saved (as `train`'s abort: exit 3)
            print(f"speedgpt sft: error: {e}", file=sys.stderr)
            return 3
        except ConfigError as e:  # (a schedule changed on resume without --extend: check_resume's line)
            print(f"speedgpt sft: config error: {e}", file=sys.stderr)
            return 2
        except LoadError as e:  # the base run's weights: sft takes its latest checkpoint (it has no --checkpoint)
            print(re.sub(r"name (another|an earlier one) with --checkpoint STEP", "sft starts from the base run's "
                         "latest checkpoint: move this one out of its checkpoints folder to start from the one before",
                         f"speedgpt sft: error: {e}"), file=sys.stderr)
            return 2
        except (RunLocked, OutDirError, RunDirInUse, CheckpointError, FileNotFoundError, ValueError) as e:
            # (a refused start wrote nothing: the lock removes the directory it made)
            print(f"speedgpt sft: error: {e}", file=sys.stderr)
            return 2
    return 0

