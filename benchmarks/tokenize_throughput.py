"""Tokenizer throughput: the speedgpt pipeline vs plain single-process tiktoken.

    python benchmarks/tokenize_throughput.py [--max-chars N] [--workers N]

Both run on the same documents (the local Python-source corpus, held in memory, so disk
reads are not measured). "per core" divides by the number of worker processes used.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.data.corpus import Documents, python_source_files  # noqa: E402
from speedgpt.data.tokenize import tokenize_corpus  # noqa: E402
from speedgpt.data.tokenizer import get_tokenizer  # noqa: E402


def benchmark_tokenize(*, max_chars: int = 40_000_000, workers: int | None = None, echo=print) -> dict:
    """Measure and print tokens/s; returns the figures as a dict."""
    workers = workers or os.cpu_count() or 1
    docs, chars = [], 0
    for doc in python_source_files().documents():
        docs.append(doc)
        chars += len(doc[1])
        if chars >= max_chars:
            break
    enc = get_tokenizer()
    enc.encode_ordinary("warm up")
    t0 = time.perf_counter()
    plain_tokens = sum(len(enc.encode_ordinary(text)) for _, text in docs)
    plain_s = time.perf_counter() - t0
    results = {
        "documents": len(docs),
        "chars": chars,
        "plain_tiktoken": {"tokens": plain_tokens, "seconds": plain_s, "tokens_per_s": plain_tokens / plain_s},
    }
    echo(f"{len(docs):,} documents, {chars / 1e6:.1f}M chars, {plain_tokens / 1e6:.2f}M tokens")
    echo(f"plain tiktoken encode_ordinary, 1 process: {plain_tokens / plain_s / 1e6:.2f}M tok/s")
    for n in sorted({1, workers}):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            manifest = tokenize_corpus(Documents(docs), tmp, workers=n, progress=False)
            seconds = time.perf_counter() - t0  # includes pool start-up, splitting, shard writes, sha256
        tps = manifest["tokens"] / seconds
        results[f"pipeline_{n}"] = {"workers": n, "tokens": manifest["tokens"], "seconds": seconds, "tokens_per_s": tps, "tokens_per_s_per_core": tps / n}
        echo(f"speedgpt tokenize_corpus, {n} worker(s): {tps / 1e6:.2f}M tok/s total, {tps / n / 1e6:.2f}M tok/s per core")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-chars", type=int, default=40_000_000)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    benchmark_tokenize(max_chars=args.max_chars, workers=args.workers)


if __name__ == "__main__":
    main()
