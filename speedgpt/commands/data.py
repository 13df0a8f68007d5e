"""`speedgpt data`: prepare shards (tokenize FILES, local-python, fineweb)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..argv import Parser, count, require_subcommand


def cmd_data(argv: list[str]) -> int:
    p = Parser(prog="speedgpt data", description="Prepare token shards.")
    sub = p.add_subparsers(dest="what")  # required: require_subcommand below, which names the choices
    t = sub.add_parser("tokenize", help="text files, directories, globs, JSONL or Parquet -> train/val shards")
    t.add_argument("inputs", nargs="+", help="files, directories or globs (.txt/.py/..., .jsonl[.gz], .parquet)")
    t.add_argument("--out", required=True, help="output directory for shards and manifest.json (old shards there are replaced)")
    t.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text")
    t.add_argument("--val-fraction", type=float, default=0.01,
                   help="share of documents for the val split, chosen by a hash of each text; at least one "
                        "document goes to val unless 0 (default 0.01)")
    t.add_argument("--shard-tokens", type=count, default=100_000_000,
                   help="tokens per shard file at most (default 100M); documents are never split, so one longer "
                        "than that gets a shard of its own, as long as the document")
    t.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: the CPU count)")
    t.add_argument("--max-tokens", type=count, default=None,
                   help="stop after this many tokens, e.g. 5e8 or 500M (default: all input)")
    t.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="a folder from `speedgpt tokenizer train` (copied next to the shards; default: GPT-2)")
    t.add_argument("--keep-duplicates", action="store_true",
                   help="keep every copy of a document (default: exact copies of a kept text are dropped, counted "
                        "in the manifest's duplicates)")
    lp = sub.add_parser("local-python", help="the Python sources of this interpreter (the default corpus)")
    lp.add_argument("--out", required=True, help="output directory for shards and manifest.json")
    lp.add_argument("--max-tokens", type=count, default=0, help="stop after this many tokens; 0: every file (default)")
    lp.add_argument("--piece-chars", type=count, default=0,
                    help="0: one document per file (default); N: pieces of about N characters cut at top-level "
                         "statements and shuffled, as the tiny-cpu preset's default corpus (data.local_piece_chars)")
    lp.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: the CPU count)")
    fw = sub.add_parser("fineweb", help="download GPT-2-tokenized FineWeb10B shards from the Hugging Face Hub")
    fw.add_argument("--out", required=True, help="directory for the downloaded shards")
    fw.add_argument("--shards", type=int, default=8, help="train shards of 100M tokens (1..103)")
    fw.add_argument("--endpoint", default=None, help="Hub endpoint (default: huggingface.co or $HF_ENDPOINT)")
    args = p.parse_args(argv)
    require_subcommand(p, args, sub)
    if args.what == "local-python" and args.piece_chars < 0:
        p.error(f"--piece-chars {args.piece_chars}: must be >= 0 (0: one document per file)")
    if getattr(args, "workers", None) is not None and args.workers < 1:
        p.error(f"--workers {args.workers}: must be >= 1 (leave it out for one per CPU)")
    if args.what == "fineweb":
        from ..data.fineweb import FINEWEB_TRAIN_SHARDS, endpoint_problem

        if not 1 <= args.shards <= FINEWEB_TRAIN_SHARDS:  # 0 fetched the val shard alone: nothing to train on
            p.error(f"--shards {args.shards}: must be 1..{FINEWEB_TRAIN_SHARDS} (train shards of 100M tokens; the "
                    f"val shard comes with them)")
        problem = endpoint_problem(args.endpoint)
        if problem:  # before --out is made
            p.error(problem)
    if args.what == "tokenize" and args.max_tokens is not None and args.max_tokens < 1:
        p.error(f"--max-tokens {args.max_tokens}: must be >= 1 (leave it out for all input)")
    if args.what == "local-python" and args.max_tokens < 0:
        p.error(f"--max-tokens {args.max_tokens}: must be >= 0 (0: every file)")
    from ..outdir import OutDirError, check_out_dir, missing_dirs, remove_empty_dirs

    try:
        check_out_dir(args.out)
    except OutDirError as e:
        print(f"speedgpt data: {e}", file=sys.stderr)
        return 2
    other = other_output(args.out)
    if other:  # the shards, manifest.json (and the old shards' removal) would land among its files
        print(f"speedgpt data: --out {args.out} holds {other}; pass another directory for the shards",
              file=sys.stderr)
        return 2
    created, status = missing_dirs(args.out), 1
    try:
        status = _data_command(args)
        return status
    finally:
        if status != 0:  # a failed command leaves no empty --out behind (only folders it made itself)
            remove_empty_dirs(created)


def other_output(out: str | Path) -> str | None:
    """What another command wrote in `out` (a run, an export, a tokenizer), or None. Shards belong in a
    folder of their own: mixed into these, a later `export` or `tokenizer train` there would remove or refuse
    them, and they would travel with the export or the tokenizer."""
    from ..rundir.export_dir import is_export_dir
    from ..rundir.reuse import holds_run
    from ..tokenizer.folder import is_tokenizer_folder

    if holds_run(out):
        return "a training run"
    if is_export_dir(out):
        return "a model export (`speedgpt export`)"
    if is_tokenizer_folder(out):
        return "a tokenizer (`speedgpt tokenizer train`)"
    return None


def _data_command(args) -> int:
    """`speedgpt data WHAT` once its arguments are checked: 0, or 2 after a one-line error."""
    from ..data.tokenize import summary_text

    try:
        if args.what == "tokenize":
            from ..data.tokenize import tokenize_files
            from ..tokenizer.folder import load_tokenizer

            tok = load_tokenizer(args.tokenizer)
            m = tokenize_files(args.inputs, args.out, text_field=args.text_field, val_fraction=args.val_fraction,
                               shard_tokens=args.shard_tokens, workers=args.workers, max_tokens=args.max_tokens,
                               tokenizer=tok, dedupe=not args.keep_duplicates)
        elif args.what == "local-python":
            from ..data.tokenize import ensure_local_python_corpus

            m = ensure_local_python_corpus(args.out, max_tokens=args.max_tokens or None, piece_chars=args.piece_chars,
                                           workers=args.workers)
        else:
            from ..data.fineweb import download_fineweb

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
        from ..outdir import os_error_line

        out = Path(args.out).resolve()
        if e.filename is None or out in Path(e.filename).resolve().parents or Path(e.filename).resolve() == out:
            print(f"speedgpt data {args.what}: error: {os_error_line(e, '--out', args.out)}", file=sys.stderr)
        else:
            print(f"speedgpt data {args.what}: error: cannot read {e.filename}: {e.strerror}; check the input path",
                  file=sys.stderr)
        return 2
    print(summary_text(m, args.out))
    return 0
