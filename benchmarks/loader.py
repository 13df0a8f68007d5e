"""TokenLoader host cost per batch and packing crop, on synthetic FineWeb-like shards.

    python benchmarks/loader.py [--tokens 100000000,20000000] [--calls 200]

Writes temporary shards whose document lengths are lognormal (mean ~1,000 tokens,
median ~600, like FineWeb), then times ``next_batch`` on the calling thread with and
without prefetch (a 3 ms sleep stands in for the training step the prefetcher overlaps).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.data.capacity import packing_stats  # noqa: E402
from speedgpt.data.loader import TokenLoader  # noqa: E402
from speedgpt.data.shards import write_shard  # noqa: E402
from speedgpt.data.tokenizer import BOS_ID  # noqa: E402

SHAPES = [(1, 49152, 1), (8, 49152, 1), (8, 1024, 1), (1, 49152, 8)]  # (B, T, world size)


def synthetic_shards(out_dir: Path, shard_tokens: list[int], seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    files = []
    for k, n in enumerate(shard_tokens):
        lengths = np.maximum(rng.lognormal(6.4, 1.0, size=n // 400 + 10).astype(np.int64), 2)
        lengths = lengths[np.cumsum(lengths) <= n]
        tokens = rng.integers(0, BOS_ID, size=int(lengths.sum()), dtype=np.uint16)
        tokens[np.concatenate([[0], np.cumsum(lengths)[:-1]])] = BOS_ID
        files.append(out_dir / f"train_{k:06d}.bin")
        write_shard(files[-1], tokens)
    return files


def benchmark_loader(*, shard_tokens: list[int] = (100_000_000, 20_000_000), calls: int = 200, echo=print) -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = synthetic_shards(Path(tmp), list(shard_tokens))
        for B, T, W in SHAPES:
            for prefetch in (False, True):
                loader = TokenLoader(files, seq_len=T, batch_size=B, world_size=W, prefetch=prefetch)
                t0 = time.perf_counter()
                loader.next_batch()
                first = time.perf_counter() - t0
                times = []
                for _ in range(calls):
                    if prefetch:
                        time.sleep(0.003)
                    t0 = time.perf_counter()
                    loader.next_batch()
                    times.append(time.perf_counter() - t0)
                loader.close()
                median = float(np.median(times))
                results[f"B{B}_T{T}_W{W}_prefetch{int(prefetch)}"] = {"first_s": first, "median_s": median}
                echo(f"B={B} T={T} world={W} prefetch={prefetch}: next_batch median {median * 1e6:.0f} us "
                     f"(first batch, incl. shard load: {first * 1e3:.0f} ms)")
        for T in (1024, 2048, 8192, 49152):
            stats = packing_stats(files[-1:], seq_len=T)
            results[f"packing_T{T}"] = stats
            echo(f"packing T={T}: {stats['cropped_fraction']:.1%} cropped, "
                 f"{stats['inserted_bos'] / stats['rows']:.1%} of rows continue a long document")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="100000000,20000000", help="comma-separated tokens per shard")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    benchmark_loader(shard_tokens=[int(x) for x in args.tokens.split(",")], calls=args.calls)


if __name__ == "__main__":
    main()
