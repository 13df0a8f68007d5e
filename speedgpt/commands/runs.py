"""The commands that read a finished run or a config: `speedgpt report`, `eval`, `sample`, `export`
and `config`."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..argv import Parser, count
from .sampling_options import add_sampling_options, check_sampling_options


def cmd_report(argv: list[str]) -> int:
    p = Parser(
        prog="speedgpt report", description="Plot and summarize one or more runs. With several, the first is the "
        "baseline A of an A/B table: val loss at equal training time and at equal tokens, and the config keys "
        "that differ from A's.")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="run directories written by `speedgpt train`; with several, the first is the baseline A")
    p.add_argument("--out", default=None,  # a str: check_out_dir refuses "" (type=Path made it ".", the cwd)
                   help="output dir for report.png/html (default: the run dir for one run, "
                        "FIRST_RUN_DIR/compare for several)")
    p.add_argument("--target-loss", type=float, default=None,
                   help="report time/tokens to reach this val loss (linear between the evaluations around the "
                        "crossing, as `speedgpt ab`)")
    p.add_argument("--title", default=None, help="plot and page title (default: speedgpt report)")
    p.add_argument("--markdown", action="store_true",
                   help="print only the A/B table, as GitHub markdown (for docs/benchmarks.md), and write no "
                        "files; needs 2+ runs")
    args = p.parse_args(argv)
    if args.target_loss is not None and not (math.isfinite(args.target_loss) and args.target_loss > 0):
        # nan or <= 0: no run reaches it, and every row said "not reached", exit 0 (`speedgpt ab` refuses it too)
        p.error(f"--target-loss {args.target_loss}: give a finite validation loss > 0, such as 3.28")
    if args.markdown and len(args.run_dirs) < 2:
        p.error("--markdown prints the A/B table: pass the baseline RUN_DIR first, then one or more variants")
    from ..outdir import OutDirError, check_out_dir
    from ..report import report_runs

    try:
        out = None if args.out is None else check_out_dir(args.out)
        report_runs(args.run_dirs, out, target_loss=args.target_loss, title=args.title, markdown=args.markdown)
    except (FileNotFoundError, ValueError, OutDirError) as e:
        print(f"speedgpt report: error: {e}", file=sys.stderr)
        return 2
    return 0


EVAL_EPILOG = """\
examples:
  speedgpt eval runs/x                             # the run's own val split, as many tokens as it validated on
  speedgpt eval runs/x --data data/fineweb10B --tokens 1048576
  speedgpt eval runs/x --hellaswag download --limit 1000
  speedgpt eval runs/x --core                      # CORE: 22 in-context tasks (bundle downloaded once)
  speedgpt eval runs/x --core --core-bundle ~/eval_bundle --core-limit 100
  speedgpt eval runs/x/export                      # an export directory works too (nothing is logged)
  speedgpt eval runs/x-sft --chat                  # an SFT run: built-in tasks' exact match and ChatCORE
  speedgpt eval runs/x-sft --chat --chat-choice arc.jsonl --chat-exact gsm8k.jsonl --limit 200
  speedgpt eval runs/x/export-hf                   # also a Hugging Face one (speedgpt export --format hf)
lm-evaluation-harness scores a Hugging Face export (pip install -e ".[hf]"; local tasks: docs/format.md):
  lm_eval --model hf --model_args pretrained=runs/x/export-hf,trust_remote_code=True --tasks hellaswag
"""


def cmd_eval(argv: list[str]) -> int:
    p = Parser(prog="speedgpt eval", epilog=EVAL_EPILOG,
               description="Validation loss, bits per byte and optionally HellaSwag accuracy and CORE of a "
                           "trained model; appended to the run's metrics.jsonl as an eval record.",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (from speedgpt train) or an export directory")
    p.add_argument("--data", metavar="GLOB_OR_DIR", help="shards to score (default: the run's own data)")
    p.add_argument("--split", choices=["val", "train"], help="which shards of a directory (default val)")
    p.add_argument("--tokens", type=count, help="tokens to score, e.g. 1M (default: the run's data.val_tokens)")
    p.add_argument("--hellaswag", metavar="PATH_OR_download", help="also score HellaSwag: a jsonl file or 'download'")
    p.add_argument("--limit", type=int, help="score only the first N HellaSwag examples (with --chat: the first N "
                                             "of each --chat-choice / --chat-exact file)")
    p.add_argument("--core", action="store_true", help="also score CORE (DCLM's 22 in-context tasks)")
    p.add_argument("--core-bundle", metavar="PATH_OR_download",
                   help="with --core: the unpacked CORE bundle (core.yaml, eval_meta_data.csv, eval_data/), or "
                        "'download' (default: fetched once into the cache)")
    p.add_argument("--core-limit", type=int, help="with --core: score only N examples per CORE task (quick, approximate)")
    p.add_argument("--chat", action="store_true", help="score a chat (SFT) model instead: exact match on the "
                   "built-in tasks and the task files below, and their ChatCORE")
    p.add_argument("--chat-examples", type=int,
                   help="with --chat: held-out examples per built-in task (0: none; default 100)")
    p.add_argument("--chat-choice", action="append", default=[], metavar="FILE",
                   help="with --chat: a multiple-choice JSONL (ARC/MMLU layout); repeatable")
    p.add_argument("--chat-exact", action="append", default=[], metavar="FILE",
                   help="with --chat: an exact-match JSONL (GSM8K layout: question, answer '... #### 42'); repeatable")
    p.add_argument("--checkpoint", metavar="STEP", help="a checkpoint step (default: the latest)")
    p.add_argument("--batch-rows", type=int, help="rows per forward (default: fits in about 32K tokens)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--no-log", action="store_true", help="do not append the result to metrics.jsonl")
    args = p.parse_args(argv)
    for flag, value in (("--tokens", args.tokens), ("--limit", args.limit), ("--batch-rows", args.batch_rows),
                        ("--core-limit", args.core_limit)):
        if value is not None and value < 1:
            p.error(f"{flag} {value}: must be >= 1")
    if args.chat_examples is not None:
        from ..chat.tasks import heldout_count_problem

        problem = heldout_count_problem("--chat-examples", args.chat_examples)
        if problem:
            p.error(problem)
    _check_eval_mode(p, args)

    from ..config import ConfigError
    from ..eval.run import EvalError, evaluate_run
    from ..infer.load import LoadError

    if args.chat:
        from ..chat.evaluate import evaluate_chat

        try:
            per_task = 100 if args.chat_examples is None else args.chat_examples
            evaluate_chat(args.run_dir, choice_files=args.chat_choice, exact_files=args.chat_exact,
                          per_task=per_task, limit=args.limit, device=args.device,
                          checkpoint=args.checkpoint, log=not args.no_log)
        except (LoadError, ConfigError, FileNotFoundError, ValueError) as e:
            print(f"speedgpt eval: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        evaluate_run(args.run_dir, data=args.data, split=args.split or "val", tokens=args.tokens,
                     hellaswag=args.hellaswag, limit=args.limit, device=args.device, checkpoint=args.checkpoint,
                     batch_rows=args.batch_rows, log=not args.no_log,
                     core=(args.core_bundle or "download") if args.core else None, core_limit=args.core_limit)
    except (LoadError, EvalError, ConfigError, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"speedgpt eval: {e}", file=sys.stderr)
        return 2
    return 0


def _check_eval_mode(p: argparse.ArgumentParser, args) -> None:
    """Refuse a flag that the chosen scoring does not read: left in, it would be silently ignored (a `--chat
    --hellaswag download` that scored no HellaSwag, a `--limit` that limited nothing)."""
    def given(*flags: str) -> list[str]:
        values = [getattr(args, f[2:].replace("-", "_")) for f in flags]
        return [f for f, v in zip(flags, values) if v is not None and v is not False and v != []]  # 0 is given

    if args.chat:
        base = given("--data", "--split", "--tokens", "--hellaswag", "--core", "--core-bundle", "--core-limit",
                     "--batch-rows")
        if base:
            p.error(f"--chat scores a chat model's tasks and does not read {' '.join(base)} (a base model's loss, "
                    f"HellaSwag or CORE); drop {'it' if len(base) == 1 else 'them'} or --chat")
        if args.limit is not None and not (args.chat_choice or args.chat_exact):
            p.error("--limit N with --chat limits the --chat-choice / --chat-exact files' examples, and none is given; "
                    "for the built-in tasks use --chat-examples N")
        return
    chat = given("--chat-examples", "--chat-choice", "--chat-exact")
    if chat:
        p.error(f"{' '.join(chat)}: score{'s' if len(chat) == 1 else ''} a chat model; add --chat")
    if args.limit is not None and not args.hellaswag:
        p.error("--limit N limits the HellaSwag examples: add --hellaswag PATH_OR_download (CORE's: --core-limit N)")
    core = given("--core-bundle", "--core-limit")
    if core and not args.core:
        p.error(f"{' '.join(core)}: {'is' if len(core) == 1 else 'are'} for CORE; add --core")


SAMPLE_EPILOG = """\
examples:
  speedgpt sample runs/x --prompt "def fibonacci(n):"            # streams the continuation
  speedgpt sample runs/x --prompt "import numpy" --prompt "class Tree:" --temperature 0  # one batch
  speedgpt sample runs/x/export --prompt "" --max-tokens 200 --seed 1                    # unconditional
Prompts of different lengths run in one batch: the shared prefix is prefilled together, the longer
prompts' remaining tokens are fed one per step, so each row equals sampling its prompt alone.
"""


def cmd_sample(argv: list[str]) -> int:
    p = Parser(prog="speedgpt sample", epilog=SAMPLE_EPILOG,
               description="Continue prompts with a trained model (KV cache; stops at end-of-text).",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (from speedgpt train) or an export directory")
    p.add_argument("--prompt", action="append", required=True, metavar="TEXT",
                   help="prompt text; repeat for several prompts, generated together in one batch")
    add_sampling_options(p, temperature=0.8, max_tokens=128, what="prompt")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence each step (the slow reference)")
    p.add_argument("--checkpoint", metavar="STEP", help="a checkpoint step (default: the latest)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    args = p.parse_args(argv)
    check_sampling_options(p, args)

    from ..config import ConfigError
    from ..infer.generate import context_cut_note, sample_texts
    from ..infer.load import LoadError, load_model
    from ..tokenizer.folder import run_tokenizer

    try:
        model, cfg = load_model(args.run_dir, device=args.device, checkpoint=args.checkpoint)
        opts = dict(max_new_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k or None,
                    seed=args.seed, use_cache=not args.no_cache, tokenizer=run_tokenizer(args.run_dir, cfg))
        note = context_cut_note(model, args.prompt, args.max_tokens, f"--max-tokens {args.max_tokens}",
                                opts["tokenizer"])
        if note:
            print(f"speedgpt sample: {note}", file=sys.stderr)
        if len(args.prompt) == 1:
            # The prompt is echoed with the first new piece, so an error (e.g. prompt too long) prints alone.
            pending = [args.prompt[0]]

            def write(piece: str) -> None:
                print(pending.pop() + piece if pending else piece, end="", flush=True)

            sample_texts(model, args.prompt, stream=write, **opts)
            print(pending.pop() if pending else "")
        else:
            for i, text in enumerate(sample_texts(model, args.prompt, **opts)):
                print(f"--- sample {i + 1}/{len(args.prompt)} ---\n{text}")
    except (LoadError, ConfigError, ValueError) as e:
        print(f"speedgpt sample: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_export(argv: list[str]) -> int:
    p = Parser(prog="speedgpt export",
               description="Write a run's weights as model.safetensors + config.json, loadable by "
                           "`speedgpt sample/eval EXPORT_DIR` and speedgpt.infer.load.load_model; "
                           "with --format hf, a folder Hugging Face transformers loads "
                           "(AutoModelForCausalLM, trust_remote_code=True) and speedgpt reads back.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (from speedgpt train)")
    p.add_argument("--out", metavar="DIR", help="export directory (default RUN_DIR/export, RUN_DIR/export-hf with "
                                                "--format hf): new, empty, or holding an earlier export, whose files "
                                                "are replaced (other files there are kept)")
    p.add_argument("--format", default="speedgpt", choices=["speedgpt", "hf"],
                   help="speedgpt (default) or hf: Hugging Face transformers' layout with modeling code and tokenizer")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="weight dtype (default bf16)")
    p.add_argument("--checkpoint", metavar="STEP", help="a checkpoint step (default: the latest)")
    args = p.parse_args(argv)

    from ..config import ConfigError
    from ..export import ExportError, export_model
    from ..infer.load import LoadError
    from ..outdir import OutDirError, check_out_dir

    try:
        if args.out is not None:  # as given: the exporters take it as a Path, where "" is "."
            check_out_dir(args.out)
        if args.format == "hf":
            from ..hf.export import export_hf

            out, notes = export_hf(args.run_dir, args.out, dtype=args.dtype, checkpoint=args.checkpoint)
        else:
            out, notes = export_model(args.run_dir, args.out, dtype=args.dtype, checkpoint=args.checkpoint), []
    except (LoadError, ExportError, ConfigError, OutDirError) as e:
        print(f"speedgpt export: {e}", file=sys.stderr)
        return 2
    from ..rundir.export_dir import written_files

    size = sum(f.stat().st_size for f in written_files(out) if f.is_file()) / 2**20
    print(f"exported {args.run_dir} -> {out} ({size:.1f} MiB, {args.dtype}, {args.format} format)")
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_config(argv: list[str]) -> int:
    p = Parser(prog="speedgpt config",
               description="Print every config key with its resolved value and what it does. "
                           "Set any key on `speedgpt train` as --section.key=value.")
    p.add_argument("--preset", help="start from this preset (default: the built-in defaults)")
    p.add_argument("--config", help="start from this config.toml (e.g. a run's)")
    p.add_argument("--list-presets", action="store_true", help="print the preset names and exit (as train's)")
    args, overrides = p.parse_known_args(argv)

    from ..config import Config, ConfigError, apply_overrides, preset_names, resolve

    if args.list_presets:
        print("\n".join(preset_names()))
        return 0
    from ..config.validate import check_config
    from ..config_docs import describe_config

    try:
        # Without --preset or --config, overrides apply to the built-in defaults the help names (and `config` alone
        # prints): resolve() starts from tiny-cpu then, and `config --model.depth=3` printed tiny-cpu's values as if
        # they were the defaults' (model.model_dim = 128 beside "(default 768)", preset = "tiny-cpu").
        cfg = resolve(args.preset, args.config, overrides) if (args.preset or args.config) else \
            apply_overrides(Config(), overrides)
        check_config(cfg)  # what `speedgpt train` would refuse is refused here too, not printed as a config
    except ConfigError as e:
        print(f"speedgpt config: config error: {e}", file=sys.stderr)
        return 2
    print(describe_config(cfg))
    return 0
