"""`speedgpt tokenizer train | eval`: fit a BPE tokenizer to your text, and measure it against GPT-2's."""

from __future__ import annotations

import argparse
import os
import sys

from ..argv import Parser, count, require_subcommand
from .patterns import DEFAULT_PATTERN, PATTERNS

EPILOG = """\
examples:
  speedgpt tokenizer train data/zh.jsonl --vocab-size 16384 --pattern cjk --out tok/zh16k
  speedgpt tokenizer train "src/**/*.py" --vocab-size 32768 --max-chars 200000000 --out tok/code32k
  speedgpt tokenizer eval tok/zh16k data/zh_test.jsonl data/en_test.txt
  speedgpt data tokenize data/zh.jsonl --tokenizer tok/zh16k --out data/zh   # shards carry the tokenizer
then `speedgpt train --data.train_files=data/zh` takes the vocabulary and BOS id from the shards.
"""


def _parser() -> tuple[argparse.ArgumentParser, argparse.Action]:
    """The parser and its subcommands' action (for require_subcommand)."""
    p = Parser(prog="speedgpt tokenizer", epilog=EPILOG,
               description="Train a byte-level BPE tokenizer on your text, or measure one.",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what")  # required: require_subcommand in main, which names the choices
    t = sub.add_parser("train", help="learn a vocabulary from text files, directories, globs, JSONL or Parquet")
    t.add_argument("inputs", nargs="+", metavar="DATA", help="files, directories or globs (.txt/.py/..., .jsonl[.gz], .parquet)")
    t.add_argument("--vocab-size", type=count, required=True,
                   help="tokens in all: 256 bytes + merges + the <|endoftext|> separator (e.g. 32768)")
    t.add_argument("--out", required=True, help="the tokenizer's folder (new or empty)")
    t.add_argument("--pattern", choices=list(PATTERNS), default=DEFAULT_PATTERN,
                   help="split pattern: nanochat (GPT-4's, numbers in 1-2 digits; default) or cjk (the same, with "
                        "runs of Chinese/Japanese characters cut at 32)")
    t.add_argument("--max-chars", type=count, default=1_000_000_000,
                   help="characters of text to read at most (default 1e9); the rest is not read")
    t.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text")
    t.add_argument("--name", default=None, help="the tokenizer's name in tables and reports (default: the folder's)")
    t.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in --out")
    e = sub.add_parser("eval", help="bytes per token and tokens per document against GPT-2's, per input")
    e.add_argument("tokenizer", metavar="DIR", help="a folder from `speedgpt tokenizer train` (or gpt2)")
    e.add_argument("inputs", nargs="+", metavar="DATA", help="files, directories or globs; one table row each")
    e.add_argument("--max-chars", type=count, default=10_000_000, help="characters read per input at most (default 1e7)")
    e.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text")
    return p, sub


def main(argv: list[str]) -> int:
    p, sub = _parser()
    args = p.parse_args(argv)
    require_subcommand(p, args, sub)
    try:
        return _train(args) if args.what == "train" else _eval(args)
    except (FileNotFoundError, ValueError) as e:  # bad inputs or folders: TokenizerError is a ValueError
        if os.environ.get("SPEEDGPT_DEBUG"):
            raise
        print(f"speedgpt tokenizer {args.what}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # no permission, a full disk, ...
        from ..outdir import os_error_line

        where = os_error_line(e, "--out", args.out) if args.what == "train" else f"{e.filename}: {e.strerror}"
        print(f"speedgpt tokenizer {args.what}: error: {where}", file=sys.stderr)
        return 2


def _train(args) -> int:
    from ..outdir import check_out_dir
    from .train import train_tokenizer

    check_out_dir(args.out)
    tok = train_tokenizer(args.inputs, args.out, vocab_size=args.vocab_size, pattern=args.pattern, name=args.name,
                          max_chars=args.max_chars, text_field=args.text_field, overwrite=args.overwrite)
    from .folder import read_meta

    tr = read_meta(tok.folder)["training"]
    print(f"trained {tok.describe()} on {tr['documents']:,} documents, {tr['chars']:,} characters in "
          f"{tr['seconds']:.1f}s ({tr['trainer']}) -> {tok.folder}")
    if tr["merges_short"]:
        print(f"  note: the text allowed {tr['merges_short']:,} fewer merges than --vocab-size {tr['vocab_size_asked']:,} "
              f"asks; the vocabulary is {tok.vocab_size:,}")
    if tr["stopped_early"]:
        print(f"  note: stopped at --max-chars {tr['max_chars']:,}: later text was not read")
    skipped = sum(sum(v["count"] for v in s["skipped"].values()) for s in tr["sources"])
    if skipped:
        print(f"  skipped {skipped:,} unreadable item{'s' * (skipped != 1)} (listed in {tok.folder}/speedgpt_tokenizer.json)")
    return 0


def _eval(args) -> int:
    from rich.console import Console

    from ..report.tables import _print_table
    from ..data.corpus import MISSING_FIELD
    from .compression import compare_inputs, table
    from .folder import load_tokenizer

    if args.max_chars < 1:
        raise ValueError(f"--max-chars {args.max_chars}: must be >= 1")
    tok = load_tokenizer(args.tokenizer)
    rows = compare_inputs(tok, args.inputs, max_chars=args.max_chars, text_field=args.text_field)
    empty = [r for r in rows if not r["documents"]]
    if empty:
        reasons = sorted({reason for r in empty for reason in r["skip_reasons"]})
        why = f"skipped: {'; '.join(reasons)}" if reasons else "every item was empty"
        field = any(r.startswith(MISSING_FIELD) for r in reasons)
        raise ValueError(f"no text read from {', '.join(r['input'] for r in empty)} ({why}); check the inputs"
                         + (f" or --text-field (now '{args.text_field}')" if field else ""))
    _print_table(Console(), f"{tok.describe()} against gpt2", *table(tok, rows), text_columns=1)
    for r in rows:  # the row measures only what was read: say what was not, as `tokenizer train` does
        if r["skipped"]:
            print(f"  note: {r['input']}: skipped {r['skipped']:,} unreadable item{'s' * (r['skipped'] != 1)} "
                  f"({'; '.join(r['skip_reasons'])}); its row measures the {r['documents']:,} documents read")
    return 0
