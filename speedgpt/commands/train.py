"""`speedgpt train`: its arguments, the run's config from a preset / config.toml / resume, the run
directory's lock and reuse checks, the training itself, and the sample and report after it."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from ..argv import Parser, refuse_empty_paths

TRAIN_EPILOG = """\
overrides: any config key as --section.key=value, e.g. --model.depth=8 --optim.muon_lr=0.03
           --train.steps=500 --data.train_files=data/mycorpus  (`speedgpt config` lists every key)
examples:
  speedgpt train                                   # default: tiny-cpu on CPU, speedrun-latest on a GPU
  speedgpt train --preset speedrun-124m --train.steps=300
  speedgpt train --config runs/x/config.toml       # reproduce a run (in a new directory; --run-dir names one)
  speedgpt train --resume runs/x                   # continue a run from its latest checkpoint
  speedgpt train --resume runs/x --train.steps=300 --extend   # train a finished run further
  speedgpt train --run-dir runs/x --auto-resume    # resume runs/x if it has a checkpoint, else start it
  (SIGTERM or Ctrl-C: the step finishes and a checkpoint is written; a second one exits at once)
A --run-dir that holds a run is refused (use --resume, a fresh directory, or --overwrite), and so is
one that another `speedgpt train` is using right now (its lock file RUN_DIR/.speedgpt-run.lock).
The saved config.toml's run.dir names the directory the run used: --run-dir beats a config file's run.dir,
a run's own config.toml given to --config starts a new directory, and --run-dir (or --resume) with a --run.dir=
naming another directory is refused.
"""


def cmd_train(argv: list[str]) -> int:
    p = Parser(prog="speedgpt train", description="Train a GPT model.", epilog=TRAIN_EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", help="preset name (default: tiny-cpu without a GPU, speedrun-latest with one)")
    p.add_argument("--config", help="a config.toml, e.g. one saved in a run directory")
    p.add_argument("--resume", metavar="RUN_DIR", help="resume RUN_DIR from its latest checkpoint")
    p.add_argument("--run-dir", help="where to write the run (default runs/<name>-<time>)")
    p.add_argument("--auto-resume", action="store_true",
                   help="resume --run-dir from its newest checkpoint if it has one, else start it (for "
                        "schedulers that re-run the same command; implied for workers torchrun restarted)")
    p.add_argument("--extend", action="store_true",
                   help="with --resume/--auto-resume: accept a changed train.steps, schedule or optimizer value (the "
                        "lr schedule is stretched from the checkpoint on), e.g. to train a finished run further, or "
                        "another data, batch, seed or model value (env.json's entry for the resume names it)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --run-dir (its config, metrics, checkpoints and reports are deleted)")
    p.add_argument("--list-presets", action="store_true", help="print the preset names and exit")
    args, overrides = p.parse_known_args(argv)
    refuse_empty_paths(p, args, ("--run-dir", "--resume"))

    from ..config import preset_names

    if args.list_presets:
        print("\n".join(preset_names()))
        return 0
    if args.auto_resume and not args.run_dir:
        p.error("--auto-resume needs --run-dir DIR (the directory to resume or start)")
    kept = [flag for flag, given in (("--run-dir", args.run_dir), ("--overwrite", args.overwrite),
                                     ("--auto-resume", args.auto_resume)) if given]
    if args.resume and kept:  # each was silently ignored: the run went on in --resume's directory
        p.error(f"--resume continues {args.resume} in place: drop {' and '.join(kept)} (a new run in another "
                f"directory is `speedgpt train --run-dir DIR`)")
    overrides = _folded(p, overrides)
    clash = _run_dir_clash(args, overrides)
    if clash:
        print(f"speedgpt train: {clash}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as held:  # the run directory's lock, released whatever happens
        # Locked before anything looks at the directory (rundir/lock.py): a second command on it is
        # refused before it reads the run's config or checks whether the directory holds a run.
        named = args.resume or args.run_dir
        if named and (not args.resume or Path(args.resume).is_dir()) and not _lock(held, named, args):
            return 2
        refusal = _sft_run_refusal(args)
        if refusal:
            print(f"speedgpt train: {refusal}", file=sys.stderr)
            return 2
        cfg = _train_config(p, args, overrides)
        if cfg is None:
            return 2
        from ..config import ConfigError
        from ..rundir import default_run_dir, with_run_dir

        if not named and _a_runs_record(args, overrides, cfg.run.dir):
            # `--config runs/x/config.toml` (or a copy of it) reproduces run x: its run.dir records where x is, not
            # where to write. --overwrite would have replaced run x from a file that only names it (a review found
            # a copied config do so): replacing a run takes its name on the command line.
            if args.overwrite:
                print(f"speedgpt train: --overwrite with --config {args.config} would replace the run in "
                      f"{cfg.run.dir}, which the file's run.dir names; give --run-dir {cfg.run.dir} to replace it, or "
                      f"drop --overwrite to start a new directory", file=sys.stderr)
                return 2
            print(f"speedgpt train: notice: {args.config} records the run in {cfg.run.dir}; this run starts in a new "
                  f"directory (--run-dir DIR names one)", file=sys.stderr)
            cfg = with_run_dir(cfg, "")

        try:  # (a default's time is this rank's clock: train() gives every rank rank 0's directory)
            run_dir = named or cfg.run.dir or str(default_run_dir(cfg))
        except ConfigError as e:
            print(f"speedgpt train: config error: {e}", file=sys.stderr)
            return 2
        if not named and not _lock(held, run_dir, args):
            return 2
        if not _run_dir_usable(args, run_dir):
            return 2
        result = _run_training(cfg, run_dir, resume=True if args.resume else "auto" if args.auto_resume else False,
                               extend=args.extend)
        if isinstance(result, int):
            return result
        if result.model is not None:  # the rank that wrote the run
            sample_and_report(cfg, result)
    return 0


def _main_rank() -> bool:
    """Whether this process is the one that decides for the run (rank 0 under torchrun, or alone)."""
    return int(os.environ.get("RANK", "0") or 0) == 0


def _sft_run_refusal(args) -> str | None:
    """Why --resume / --auto-resume may not continue the directory: it holds an SFT run (sft.json). Pretraining would
    go on from the fine-tuned weights on the base corpus, and its loader state is no TokenLoader's: the run
    failed only after the model was built, or, when finished, was called complete with `--extend` as the advice."""
    from ..rundir import SFT_SPEC_FILE

    named = args.resume or (args.run_dir if args.auto_resume else None)
    if not named or not (Path(named) / SFT_SPEC_FILE).is_file():
        return None
    flag = "--resume" if args.resume else "--auto-resume --run-dir"
    return (f"{flag} {named} holds an SFT run (its {SFT_SPEC_FILE}); continue it with `speedgpt sft --resume {named}`, "
            f"or pretrain further from its base run (named in {SFT_SPEC_FILE})")


def _lock(held: contextlib.ExitStack, run_dir: str, args) -> bool:
    """Lock `run_dir` for this command (rank 0 only), kept by `held`; False after a one-line error."""
    if not _main_rank():
        return True
    from ..outdir import OutDirError
    from ..rundir.lock import RunLocked, lock_run_dir

    try:
        held.enter_context(lock_run_dir(run_dir, flag="--resume" if args.resume else "--run-dir",
                                        notice=lambda line: print(f"speedgpt train: {line}", file=sys.stderr)))
    except (RunLocked, OutDirError) as e:
        print(f"speedgpt train: {e}", file=sys.stderr)
        return False
    return True


def _folded(p: argparse.ArgumentParser, overrides: list[str]) -> list[str]:
    """The overrides as --section.key=value: "--key value" is accepted too, folded here before the shape is checked."""
    folded: list[str] = []
    for item in overrides:
        if folded and "=" not in folded[-1] and not item.startswith("--"):
            folded[-1] += "=" + item
        else:
            folded.append(item)
    bad = [o for o in folded if not o.startswith("--") or "." not in o.split("=", 1)[0] or "=" not in o]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)} (config overrides look like --model.depth=8)")
    return folded


def _run_dir_override(overrides: list[str]) -> str | None:
    """The value of the last --run.dir= among the (folded) overrides; None when none gives it."""
    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "--run.dir"]
    return given[-1] if given else None


def _run_dir_clash(args, overrides: list[str]) -> str | None:
    """--run.dir=B beside --run-dir A or --resume A naming another directory: which one did the user mean? The run
    went to A and its config.toml said B (a new-user audit). The two naming one directory are fine."""
    given = _run_dir_override(overrides)
    named = args.resume or args.run_dir
    if not given or not named or Path(given).resolve() == Path(named).resolve():
        return None
    if args.resume:
        return f"--resume {named} continues {named} in place: drop --run.dir={given}"
    return f"--run-dir {named} and --run.dir={given} name two directories; give one of them"


def _a_runs_record(args, overrides: list[str], run_dir: str) -> bool:
    """Whether the --config file's run.dir (`run_dir`, no --run.dir= overriding it) names a directory that holds a
    run: the file is that run's config.toml or a copy of it, a record of where the run is (rundir.with_run_dir),
    not a place to write."""
    from ..rundir import RunDir

    if args.resume or not args.config or _run_dir_override(overrides) is not None:
        return False
    return bool(run_dir) and RunDir(run_dir).is_run()


def _train_config(p: argparse.ArgumentParser, args, folded: list[str]):
    """The run's config from --preset / --config / --resume and the (folded) overrides, on a device that
    exists here; None (after a one-line error) when it cannot be had."""
    from ..config import ConfigError, apply_overrides, default_preset, resolve
    from ..device import DeviceError, resolve_device

    config_file = args.config
    run_config = None  # the resumed run's own config.toml, read whole (a cut-short one is refused, not defaulted)
    if args.resume:
        from ..rundir import RunDir

        run = RunDir(args.resume)
        if not run.root.exists() or (not run.is_run() and not config_file):  # (--config: a run that lost its file)
            what = "does not exist" if not run.root.exists() else "holds no run (no config.toml)"
            print(f"speedgpt train: --resume {args.resume} {what}; give the directory of an earlier run "
                  f"(runs/<name>), or start one with --run-dir", file=sys.stderr)
            return None
        if not config_file:
            try:
                run_config = run.read_config()
            except ConfigError as e:
                print(f"speedgpt train: config error: {e}", file=sys.stderr)
                return None
    preset = args.preset
    if run_config is not None and preset:
        # The first command again with --resume: the run goes on from its own config, which names its preset.
        if run_config.preset != preset:
            print(f"speedgpt train: --resume {args.resume} continues a run of preset '{run_config.preset or 'none'}' "
                  f"with its own config; drop --preset {preset}", file=sys.stderr)
            return None
        preset = None
    if not preset and not config_file and run_config is None:
        preset = default_preset()
    try:
        cfg = apply_overrides(run_config, folded) if run_config is not None else resolve(preset, config_file, folded)
        resolve_device(cfg.train.device, option="--train.device")
    except ConfigError as e:
        print(f"speedgpt train: config error: {e}", file=sys.stderr)
        return None
    except DeviceError as e:
        print(f"speedgpt train: {e}", file=sys.stderr)
        return None
    return cfg


def _run_dir_usable(args, new_dir: str) -> bool:
    """A new run never writes into another run's directory (rundir/reuse.py); False after a one-line error.
    (A file where the directory must go, or one that cannot be written, was refused when it was locked.)"""
    if args.resume or not _main_rank():  # one rank decides (torchrun)
        return True
    from ..rundir import RunDir
    from ..rundir.reuse import RunDirInUse, finished_run, prepare_new_run_dir, took_no_step

    # --auto-resume, or a worker torchrun restarted: a run dir with a checkpoint is resumed by
    # train(); one without (killed before its first checkpoint) is started afresh.
    auto = args.auto_resume or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    if auto and RunDir(new_dir).list_checkpoints():
        return True  # train() resumes it
    notice = lambda line: print(f"speedgpt train: {line}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        if auto and not args.overwrite:
            if finished_run(new_dir):  # nothing to resume, and its results are no failed start's: kept
                raise RunDirInUse(f"{new_dir} holds a finished run without a checkpoint (nothing to resume); pick a "
                                  f"fresh --run-dir, or pass --overwrite to replace it")
            if not took_no_step(new_dir):
                notice(f"notice: {new_dir} holds a run stopped before its first checkpoint (nothing to resume); its "
                       f"files are replaced by this run's, from step 0")
        prepare_new_run_dir(new_dir, overwrite=args.overwrite or auto, notice=notice)
    except RunDirInUse as e:
        print(f"speedgpt train: {e}", file=sys.stderr)
        return False
    return True


def _run_training(cfg, run_dir: str | None, resume, extend: bool = False):
    """train(), its errors as one line and an exit status (an int); the TrainResult otherwise."""
    from ..config import ConfigError
    from ..rundir.checkpoint import CheckpointError
    from ..train.guard import NonFiniteError
    from ..train.loop import train
    from ..train.preempt import TrainingStopped
    from ..train.resume import RunComplete

    try:
        result = train(cfg, run_dir=run_dir, resume=resume, extend=extend)
        # The run is complete and saved: a SIGTERM in the last moments of interpreter shutdown must not
        # turn its exit status into a failure (a scheduler would then retry a finished run).
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ConfigError as e:
        print(f"speedgpt train: config error: {e}", file=sys.stderr)
        return 2
    except RunComplete as e:  # nothing to train: not an error (a scheduler re-running a finished job)
        if _main_rank():
            print(f"speedgpt train: {e}", flush=True)
        return 0
    except TrainingStopped as e:  # SIGTERM / Ctrl-C: saved, not finished
        if _main_rank():  # one line per run, not per rank
            print(f"speedgpt train: {e}", file=sys.stderr)
        return e.exit_code
    except NonFiniteError as e:
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"speedgpt train: error: {e}", file=sys.stderr)
        return 3
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        # Bad data or checkpoints: one line that says what to do. SPEEDGPT_DEBUG=1 shows the traceback.
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        if resume is True and isinstance(e, FileNotFoundError):  # data paths of the run's config.toml, relative to its start
            from ..rundir.env import with_start_dir

            e = with_start_dir(str(e), run_dir, [cfg.data.train_files, cfg.data.val_files])
        print(f"speedgpt train: error: {e}", file=sys.stderr)
        return 2
    return result


def sample_and_report(cfg, result) -> None:
    """What `speedgpt train` adds after training: a sample from the trained model and the run's report."""
    try:
        if cfg.run.sample_tokens:
            from ..infer.generate import context_cut_note, sample_text
            from ..tokenizer.folder import run_tokenizer

            tok = run_tokenizer(result.run_dir)
            # (start refused only a sample past the context; one that fits it but not beside the prompt was cut short
            # without a word, as `speedgpt sample` says it)
            note = context_cut_note(result.model, [cfg.run.sample_prompt], cfg.run.sample_tokens,
                                    f"run.sample_tokens={cfg.run.sample_tokens}", tok)
            if note:
                print(f"speedgpt train: {note}", file=sys.stderr, flush=True)
            text = sample_text(result.model, cfg.run.sample_prompt, max_new_tokens=cfg.run.sample_tokens,
                               temperature=0.8, top_k=50, seed=cfg.train.seed, tokenizer=tok)
            print("sample:\n" + text, flush=True)
    finally:  # a sample that fails still fails the command (cli.py's one line), but after the run's report
        if cfg.run.report:
            _write_report(result)


def _write_report(result) -> None:
    try:
        from ..report import write_report

        paths = write_report([result.run_dir], result.run_dir)
        print(f"report: {paths.get('png', '')}", flush=True)
    except Exception as e:  # a plotting failure must not lose a finished run
        print(f"report: not written ({type(e).__name__}: {e})", flush=True)
