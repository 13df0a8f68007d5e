"""Command line: `speedgpt train | data | report | ...`.

Each subcommand parses its own arguments and imports its heavy modules only when it runs, so
`speedgpt --help` is instant.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

TRAIN_EPILOG = """\
overrides: any config key as --section.key=value, e.g. --model.depth=8 --optim.muon_lr=0.03
           --train.steps=500 --data.train_files=data/mycorpus  (`speedgpt config` lists every key)
examples:
  speedgpt train                                   # default: tiny-cpu on CPU, speedrun-124m on a GPU
  speedgpt train --preset speedrun-124m --train.steps=300
  speedgpt train --config runs/x/config.toml       # reproduce a run
  speedgpt train --resume runs/x                   # continue a run from its latest checkpoint
  speedgpt train --resume runs/x --train.steps=300 --extend   # train a finished run further
  speedgpt train --run-dir runs/x --auto-resume    # resume runs/x if it has a checkpoint, else start it
  (SIGTERM or Ctrl-C: the step finishes and a checkpoint is written; a second one exits at once)
A --run-dir that holds a run is refused (use --resume, a fresh directory, or --overwrite), and so is
one that another `speedgpt train` is using right now (its lock file RUN_DIR/.speedgpt-run.lock).
"""


def cmd_train(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speedgpt train", description="Train a GPT model.", epilog=TRAIN_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", help="preset name (default: tiny-cpu without a GPU, speedrun-124m with one)")
    p.add_argument("--config", help="a config.toml, e.g. one saved in a run directory")
    p.add_argument("--resume", metavar="RUN_DIR", help="resume RUN_DIR from its latest checkpoint")
    p.add_argument("--run-dir", help="where to write the run (default runs/<name>-<time>)")
    p.add_argument("--auto-resume", action="store_true",
                   help="resume --run-dir from its newest checkpoint if it has one, else start it (for "
                        "schedulers that re-run the same command; implied for workers torchrun restarted)")
    p.add_argument("--extend", action="store_true",
                   help="with --resume/--auto-resume: accept a changed train.steps or schedule (the lr schedule "
                        "is stretched from the checkpoint on), e.g. to train a finished run further")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --run-dir (its config, metrics, checkpoints and reports are deleted)")
    p.add_argument("--list-presets", action="store_true", help="print the preset names and exit")
    args, overrides = p.parse_known_args(argv)

    from .config import preset_names

    if args.list_presets:
        print("\n".join(preset_names()))
        return 0
    if args.auto_resume and not args.run_dir:
        p.error("--auto-resume needs --run-dir DIR (the directory to resume or start)")
    with contextlib.ExitStack() as held:  # the run directory's lock, released whatever happens
        # Locked before anything looks at the directory (rundir/lock.py): a second command on it is
        # refused before it reads the run's config or checks whether the directory holds a run.
        named = args.resume or args.run_dir
        if named and (not args.resume or Path(args.resume).is_dir()) and not _lock(held, named, args):
            return 2
        cfg = _train_config(p, args, overrides)
        if cfg is None:
            return 2
        from .rundir import default_run_dir

        run_dir = named or cfg.run.dir or str(default_run_dir(cfg))
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


def _lock(held: contextlib.ExitStack, run_dir: str, args) -> bool:
    """Lock `run_dir` for this command (rank 0 only), kept by `held`; False after a one-line error."""
    if not _main_rank():
        return True
    from .outdir import OutDirError
    from .rundir.lock import RunLocked, lock_run_dir

    try:
        held.enter_context(lock_run_dir(run_dir, flag="--resume" if args.resume else "--run-dir",
                                        notice=lambda line: print(f"speedgpt train: {line}", file=sys.stderr)))
    except (RunLocked, OutDirError) as e:
        print(f"speedgpt train: {e}", file=sys.stderr)
        return False
    return True


def _train_config(p: argparse.ArgumentParser, args, overrides: list[str]):
    """The run's config from --preset / --config / --resume and the overrides, on a device that
    exists here; None (after a one-line error) when it cannot be had."""
    from .config import ConfigError, default_preset, resolve
    from .device import DeviceError, resolve_device

    # "--key value" is accepted too: fold it into "--key=value" before checking the shape.
    folded: list[str] = []
    for item in overrides:
        if folded and "=" not in folded[-1] and not item.startswith("--"):
            folded[-1] += "=" + item
        else:
            folded.append(item)
    bad = [o for o in folded if not o.startswith("--") or "." not in o.split("=", 1)[0] or "=" not in o]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)} (config overrides look like --model.depth=8)")
    config_file = args.config
    if args.resume:
        from .rundir import RunDir

        run = RunDir(args.resume)
        if not run.is_run() and not config_file:
            what = "does not exist" if not run.root.exists() else "holds no run (no config.toml)"
            print(f"speedgpt train: --resume {args.resume} {what}; give the directory of an earlier run "
                  f"(runs/<name>), or start one with --run-dir", file=sys.stderr)
            return None
        config_file = config_file or str(run.config_path)
    preset = args.preset
    if not preset and not config_file:
        preset = default_preset()
    try:
        cfg = resolve(preset, config_file, folded)
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
    from .rundir import RunDir
    from .rundir.reuse import RunDirInUse, prepare_new_run_dir

    # --auto-resume, or a worker torchrun restarted: a run dir with a checkpoint is resumed by
    # train(); one without (killed before its first checkpoint) is started afresh.
    auto = args.auto_resume or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    try:
        if not (auto and RunDir(new_dir).list_checkpoints()):
            prepare_new_run_dir(new_dir, overwrite=args.overwrite or auto)
    except RunDirInUse as e:
        print(f"speedgpt train: {e}", file=sys.stderr)
        return False
    return True


def _run_training(cfg, run_dir: str | None, resume, extend: bool = False):
    """train(), its errors as one line and an exit status (an int); the TrainResult otherwise."""
    from .config import ConfigError
    from .rundir.checkpoint import CheckpointError
    from .train.guard import NonFiniteError
    from .train.loop import train
    from .train.preempt import TrainingStopped
    from .train.resume import RunComplete

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
        print(f"speedgpt train: error: {e}", file=sys.stderr)
        return 2
    return result


def sample_and_report(cfg, result) -> None:
    """What `speedgpt train` adds after training: a sample from the trained model and the run's report."""
    if cfg.run.sample_tokens:
        from .infer.generate import sample_text
        from .tokenizer.folder import run_tokenizer

        text = sample_text(result.model, cfg.run.sample_prompt, max_new_tokens=cfg.run.sample_tokens,
                           temperature=0.8, top_k=50, seed=cfg.train.seed, tokenizer=run_tokenizer(result.run_dir))
        print("sample:\n" + text, flush=True)
    if cfg.run.report:
        try:
            from .report import write_report

            paths = write_report([result.run_dir], result.run_dir)
            print(f"report: {paths.get('png', '')}", flush=True)
        except Exception as e:  # a plotting failure must not lose a finished run
            print(f"report: not written ({type(e).__name__}: {e})", flush=True)


def cmd_data(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speedgpt data", description="Prepare token shards.")
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tokenize", help="text files, directories, globs, JSONL or Parquet -> train/val shards")
    t.add_argument("inputs", nargs="+", help="files, directories or globs (.txt/.py/..., .jsonl[.gz], .parquet)")
    t.add_argument("--out", required=True, help="output directory for shards and manifest.json (old shards there are replaced)")
    t.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text")
    t.add_argument("--val-fraction", type=float, default=0.01,
                   help="share of documents for the val split, chosen by a hash of each text; at least one "
                        "document goes to val unless 0 (default 0.01)")
    t.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file at most (default 100M)")
    t.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: the CPU count)")
    t.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens (default: all input)")
    t.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="a folder from `speedgpt tokenizer train` (copied next to the shards; default: GPT-2)")
    lp = sub.add_parser("local-python", help="the Python sources of this interpreter (the default corpus)")
    lp.add_argument("--out", required=True, help="output directory for shards and manifest.json")
    lp.add_argument("--max-tokens", type=int, default=0, help="stop after this many tokens; 0: every file (default)")
    lp.add_argument("--piece-chars", type=int, default=0,
                    help="0: one document per file (default); N: pieces of about N characters cut at top-level "
                         "statements and shuffled, as the tiny-cpu preset's default corpus (data.local_piece_chars)")
    lp.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: the CPU count)")
    fw = sub.add_parser("fineweb", help="download GPT-2-tokenized FineWeb10B shards from the Hugging Face Hub")
    fw.add_argument("--out", required=True, help="directory for the downloaded shards")
    fw.add_argument("--shards", type=int, default=8, help="train shards of 100M tokens (1..103)")
    fw.add_argument("--endpoint", default=None, help="Hub endpoint (default: huggingface.co or $HF_ENDPOINT)")
    args = p.parse_args(argv)
    if args.what == "local-python" and args.piece_chars < 0:
        p.error(f"--piece-chars {args.piece_chars}: must be >= 0 (0: one document per file)")
    from .outdir import OutDirError, check_out_dir, missing_dirs, remove_empty_dirs

    try:
        check_out_dir(args.out)
    except OutDirError as e:
        print(f"speedgpt data: {e}", file=sys.stderr)
        return 2
    created, status = missing_dirs(args.out), 1
    try:
        status = _data_command(args)
        return status
    finally:
        if status != 0:  # a failed command leaves no empty --out behind (only folders it made itself)
            remove_empty_dirs(created)


def _data_command(args) -> int:
    """`speedgpt data WHAT` once its arguments are checked: 0, or 2 after a one-line error."""
    from .data.tokenize import summary_text

    try:
        if args.what == "tokenize":
            from .data.tokenize import tokenize_files
            from .tokenizer.folder import load_tokenizer

            tok = load_tokenizer(args.tokenizer)
            m = tokenize_files(args.inputs, args.out, text_field=args.text_field, val_fraction=args.val_fraction,
                               shard_tokens=args.shard_tokens, workers=args.workers, max_tokens=args.max_tokens,
                               tokenizer=tok)
        elif args.what == "local-python":
            from .data.tokenize import ensure_local_python_corpus

            m = ensure_local_python_corpus(args.out, max_tokens=args.max_tokens or None, piece_chars=args.piece_chars,
                                           workers=args.workers)
        else:
            from .data.fineweb import download_fineweb

            files = download_fineweb(args.out, args.shards, endpoint=args.endpoint)
            print(f"{len(files)} shards in {args.out}")
            return 0
    except (FileNotFoundError, ValueError) as e:  # bad inputs, nothing usable read (TokenizeError)
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"speedgpt data {args.what}: error: {e}", file=sys.stderr)
        return 2
    except ConnectionError as e:  # the Hub endpoint did not answer (data/fineweb.py names it and the fix)
        print(f"speedgpt data {args.what}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # no permission, a full disk, ...: while writing the output, or reading an input
        from .outdir import os_error_line

        out = Path(args.out).resolve()
        if e.filename is None or out in Path(e.filename).resolve().parents or Path(e.filename).resolve() == out:
            print(f"speedgpt data {args.what}: error: {os_error_line(e, '--out', args.out)}", file=sys.stderr)
        else:
            print(f"speedgpt data {args.what}: error: cannot read {e.filename}: {e.strerror}; check the input path",
                  file=sys.stderr)
        return 2
    print(summary_text(m, args.out))
    return 0


def cmd_report(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="speedgpt report", description="Plot and summarize one or more runs. With several, the first is the "
        "baseline A of an A/B table: val loss at equal training time and at equal tokens, and the config keys "
        "that differ from A's.")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="run directories written by `speedgpt train`; with several, the first is the baseline A")
    p.add_argument("--out", type=Path, default=None,
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
    if args.markdown and len(args.run_dirs) < 2:
        p.error("--markdown prints the A/B table: pass the baseline RUN_DIR first, then one or more variants")
    from .report import report_runs

    try:
        report_runs(args.run_dirs, args.out, target_loss=args.target_loss, title=args.title, markdown=args.markdown)
    except (FileNotFoundError, ValueError) as e:
        print(f"speedgpt report: error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_sweep(argv: list[str]) -> int:
    from .sweep import main as sweep_main

    return sweep_main(argv)


def cmd_bench(argv: list[str]) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


EVAL_EPILOG = """\
examples:
  speedgpt eval runs/x                             # the run's own val split, as many tokens as it validated on
  speedgpt eval runs/x --data data/fineweb10B --tokens 1048576
  speedgpt eval runs/x --hellaswag download --limit 1000
  speedgpt eval runs/x --core                      # CORE: 22 in-context tasks (bundle downloaded once)
  speedgpt eval runs/x --core --core-bundle ~/eval_bundle --core-limit 100
  speedgpt eval runs/x/export                      # an export directory works too (nothing is logged)
  speedgpt eval runs/x/export-hf                   # also a Hugging Face one (speedgpt export --format hf)
lm-evaluation-harness scores a Hugging Face export (pip install -e ".[hf]"; local tasks: docs/format.md):
  lm_eval --model hf --model_args pretrained=runs/x/export-hf,trust_remote_code=True --tasks hellaswag
"""


def cmd_eval(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speedgpt eval", epilog=EVAL_EPILOG,
                                description="Validation loss, bits per byte and optionally HellaSwag accuracy and CORE of a "
                                            "trained model; appended to the run's metrics.jsonl as an eval record.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (from speedgpt train) or an export directory")
    p.add_argument("--data", metavar="GLOB_OR_DIR", help="shards to score (default: the run's own data)")
    p.add_argument("--split", default="val", choices=["val", "train"], help="which shards of a directory (default val)")
    p.add_argument("--tokens", type=int, help="tokens to score (default: the run's data.val_tokens)")
    p.add_argument("--hellaswag", metavar="PATH_OR_download", help="also score HellaSwag: a jsonl file or 'download'")
    p.add_argument("--limit", type=int, help="score only the first N HellaSwag examples")
    p.add_argument("--core", action="store_true", help="also score CORE (DCLM's 22 in-context tasks)")
    p.add_argument("--core-bundle", metavar="PATH_OR_download", default="download",
                   help="the unpacked CORE bundle (core.yaml, eval_meta_data.csv, eval_data/), or 'download' "
                        "(default: fetched once into the cache)")
    p.add_argument("--core-limit", type=int, help="score only N examples per CORE task (quick, approximate)")
    p.add_argument("--checkpoint", metavar="STEP", help="a checkpoint step (default: the latest)")
    p.add_argument("--batch-rows", type=int, help="rows per forward (default: fits in about 32K tokens)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--no-log", action="store_true", help="do not append the result to metrics.jsonl")
    args = p.parse_args(argv)
    for flag, value in (("--tokens", args.tokens), ("--limit", args.limit), ("--batch-rows", args.batch_rows)):
        if value is not None and value < 1:
            p.error(f"{flag} {value}: must be >= 1")
    if args.core_limit is not None and (args.core_limit < 1 or not args.core):
        p.error("--core-limit N needs --core and N >= 1")

    from .config import ConfigError
    from .eval.run import EvalError, evaluate_run
    from .infer.load import LoadError

    try:
        evaluate_run(args.run_dir, data=args.data, split=args.split, tokens=args.tokens, hellaswag=args.hellaswag,
                     limit=args.limit, device=args.device, checkpoint=args.checkpoint, batch_rows=args.batch_rows,
                     log=not args.no_log, core=args.core_bundle if args.core else None, core_limit=args.core_limit)
    except (LoadError, EvalError, ConfigError, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"speedgpt eval: {e}", file=sys.stderr)
        return 2
    return 0


SAMPLE_EPILOG = """\
examples:
  speedgpt sample runs/x --prompt "def fibonacci(n):"            # streams the continuation
  speedgpt sample runs/x --prompt "import numpy" --prompt "class Tree:" --temperature 0  # one batch
  speedgpt sample runs/x/export --prompt "" --max-tokens 200 --seed 1                    # unconditional
Prompts of different lengths run in one batch: the shared prefix is prefilled together, the longer
prompts' remaining tokens are fed one per step, so each row equals sampling its prompt alone.
"""


def cmd_sample(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speedgpt sample", epilog=SAMPLE_EPILOG,
                                description="Continue prompts with a trained model (KV cache; stops at end-of-text).",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (from speedgpt train) or an export directory")
    p.add_argument("--prompt", action="append", required=True, metavar="TEXT",
                   help="prompt text; repeat for several prompts, generated together in one batch")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens; 0: all (default 50)")
    p.add_argument("--seed", type=int, help="seed for reproducible samples (default: fresh randomness)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence each step (the slow reference)")
    p.add_argument("--checkpoint", metavar="STEP", help="a checkpoint step (default: the latest)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    args = p.parse_args(argv)
    if args.max_tokens < 1:
        p.error(f"--max-tokens {args.max_tokens}: must be >= 1")
    if args.top_k < 0:
        p.error(f"--top-k {args.top_k}: must be >= 0 (0: all tokens)")
    if not args.temperature >= 0:  # also rejects nan
        p.error(f"--temperature {args.temperature}: must be >= 0 (0: greedy)")

    from .config import ConfigError
    from .infer.generate import sample_texts
    from .infer.load import LoadError, load_model
    from .tokenizer.folder import run_tokenizer

    try:
        model, cfg = load_model(args.run_dir, device=args.device, checkpoint=args.checkpoint)
        opts = dict(max_new_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k or None,
                    seed=args.seed, use_cache=not args.no_cache, tokenizer=run_tokenizer(args.run_dir, cfg))
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
    p = argparse.ArgumentParser(prog="speedgpt export",
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

    from .config import ConfigError
    from .export import ExportError, export_model
    from .infer.load import LoadError

    try:
        if args.format == "hf":
            from .hf.export import export_hf

            out, notes = export_hf(args.run_dir, args.out, dtype=args.dtype, checkpoint=args.checkpoint)
        else:
            out, notes = export_model(args.run_dir, args.out, dtype=args.dtype, checkpoint=args.checkpoint), []
    except (LoadError, ExportError, ConfigError) as e:
        print(f"speedgpt export: {e}", file=sys.stderr)
        return 2
    from .rundir.export_dir import written_files

    size = sum(f.stat().st_size for f in written_files(out) if f.is_file()) / 2**20
    print(f"exported {args.run_dir} -> {out} ({size:.1f} MiB, {args.dtype}, {args.format} format)")
    for note in notes:
        print(f"note: {note}")
    return 0


def cmd_tokenizer(argv: list[str]) -> int:
    from .tokenizer.cli import main as tokenizer_main

    return tokenizer_main(argv)


def cmd_ab(argv: list[str]) -> int:
    from .ab.cli import main as ab_main

    return ab_main(argv)


def cmd_config(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speedgpt config",
                                description="Print every config key with its resolved value and what it does. "
                                            "Set any key on `speedgpt train` as --section.key=value.")
    p.add_argument("--preset", help="start from this preset (default: the built-in defaults)")
    p.add_argument("--config", help="start from this config.toml (e.g. a run's)")
    args, overrides = p.parse_known_args(argv)

    from .config import Config, ConfigError, resolve
    from .config_docs import describe_config

    try:
        cfg = resolve(args.preset, args.config, overrides) if (args.preset or args.config or overrides) else Config()
    except ConfigError as e:
        print(f"speedgpt config: config error: {e}", file=sys.stderr)
        return 2
    print(describe_config(cfg))
    return 0


def cmd_help(argv: list[str]) -> int:
    if not argv:
        return _main(["--help"])
    if argv[0] not in COMMANDS:
        print(f"speedgpt help: unknown command '{argv[0]}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return _main([*argv, "--help"])  # e.g. `speedgpt help data tokenize`


def _error_line(e: BaseException) -> str:
    """The first line of an error's message; unexpected error types keep their name."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    if not isinstance(e, (ValueError, OSError, RuntimeError)):
        text = f"{type(e).__name__}: {text} (SPEEDGPT_DEBUG=1 shows the traceback)"
    return text


COMMANDS = {
    "train": (cmd_train, "train a model (default job: tiny-cpu on CPU, speedrun-124m on a GPU)"),
    "data": (cmd_data, "prepare shards: tokenize FILES | local-python | fineweb"),
    "tokenizer": (cmd_tokenizer, "your own BPE tokenizer: train DATA --vocab-size N --out DIR | eval DIR DATA"),
    "bench": (cmd_bench, "measure tokens/s, MFU, memory and compile time of a preset (A/B with --ab)"),
    "report": (cmd_report, "plot and compare runs: RUN_DIR [RUN_DIR ...]"),
    "eval": (cmd_eval, "val loss, bits per byte, HellaSwag of a run: RUN_DIR [--data ...] [--hellaswag ...]"),
    "sample": (cmd_sample, "continue prompts with a trained model: RUN_DIR --prompt TEXT [--prompt ...]"),
    "ab": (cmd_ab, "paired A/B over seeds: --preset P --a \"OVERRIDES\" --b \"OVERRIDES\" --seeds N [--target-loss L]"),
    "sweep": (cmd_sweep, "depths x budgets, then the compute-optimal frontier: --out DIR --depths 4,6 --flops 1e15,3e15"),
    "export": (cmd_export, "weights as model.safetensors + config.json: RUN_DIR [--out DIR] [--dtype bf16|fp32] "
                           "[--format speedgpt|hf]"),
    "config": (cmd_config, "every config key with its value and a description: [--preset P] [--config FILE]"),
    "help": (cmd_help, "this list, or a command's options: help [COMMAND]"),
}


LOADS_TORCH = {"train", "bench", "eval", "sample", "export"}


def main(argv: list[str] | None = None) -> int:
    try:
        status = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's own flush at exit
        return status
    except BrokenPipeError:
        # The reader stopped reading (`speedgpt config | head`), having what it wanted: end quietly,
        # as command-line tools do. stdout goes to /dev/null so the flush at exit finds no pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["train"]
    if argv[0] in ("-h", "--help"):
        print("usage: speedgpt COMMAND [options]\n\ncommands:")
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:<9} {help_}")
        print("\n`speedgpt help COMMAND` for a command's options; `speedgpt` alone runs `speedgpt train`.")
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(__version__)
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"speedgpt: unknown command '{name}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    # Last resort for what a command does not handle itself: one line and a non-zero status, never a
    # traceback (SPEEDGPT_DEBUG=1 shows it). Ctrl-C: "interrupted" and 130, the shell's code for SIGINT.
    try:
        if name in LOADS_TORCH and not {"-h", "--help"} & set(argv):
            from .interrupt import holding_ctrl_c

            holding_ctrl_c()  # torch's import can swallow a Ctrl-C (interrupt.py): load it with the signal held
        return COMMANDS[name][0](argv[1:])
    except KeyboardInterrupt:
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"\nspeedgpt {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # main() ends quietly
    except Exception as e:
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"speedgpt {name}: error: {_error_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
