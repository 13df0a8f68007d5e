"""TokenLoader host cost per batch and packing crop, on synthetic FineWeb-like shards; with --mix, the
mix planner's cost per optimizer step and documents per row on code-like documents.

    python benchmarks/loader.py [--tokens 100000000,20000000] [--calls 200]
    python benchmarks/loader.py --mix [--mix-docs 64,256,1024] [--steps 20]

Writes temporary shards whose document lengths are lognormal (mean ~1,000 tokens,
median ~600, like FineWeb), then times ``next_batch`` on the calling thread with and
without prefetch (a 3 ms sleep stands in for the training step the prefetcher overlaps).
--mix: shards of 50M tokens in documents like the local Python corpus's files (lognormal, median ~2,800,
mean ~8,000 tokens); times planning one optimizer step of each speedrun-latest stage (all ranks' rows:
every rank plans them all) and counts the distinct documents per row, for mix and for split.
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
# speedrun-latest's stages (step tokens, row length, max_doc_len), and the last at twice the batch
MIX_STAGES = [(131072, 16384, 896), (262144, 16384, 2048), (393216, 49152, 2048), (786432, 49152, 2048)]


def synthetic_shards(out_dir: Path, shard_tokens: list[int], seed: int = 0, mu: float = 6.4,
                     sigma: float = 1.0) -> list[Path]:
    rng = np.random.default_rng(seed)
    files = []
    for k, n in enumerate(shard_tokens):
        lengths = np.maximum(rng.lognormal(mu, sigma, size=int(n / np.exp(mu) * 2) + 10).astype(np.int64), 2)
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


def benchmark_mix(*, mix_docs: list[int], steps: int = 20, echo=print) -> dict:
    """Per speedrun-latest stage: milliseconds to plan one optimizer step's rows, planner tokens/s, and
    distinct documents per row, for long_docs=mix with each K and for split."""
    from speedgpt.data.greedy import GreedyRows
    from speedgpt.data.mix import MixRows
    from speedgpt.data.stream import EpochStreams, ShardCache

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = synthetic_shards(Path(tmp), [50_000_000], mu=7.95, sigma=1.3)  # median ~2,800, mean ~8,000
        streams = EpochStreams(ShardCache(files, BOS_ID), seed=0)
        stream = streams.stream(0)
        for step_tokens, T, cap in MIX_STAGES:
            n_rows = step_tokens // T
            for k in mix_docs:
                planner = MixRows(streams, k, seed=0)
                state = planner.initial_state()
                planner.plan(state, 8 * n_rows, T + 1, cap)  # warm: shard loaded
                times, last_step, gaps = [], {}, []  # gaps: steps from a document's piece to its next one
                for step in range(steps):
                    t0 = time.perf_counter()
                    rows, after = planner.plan(state, n_rows, T + 1, cap)
                    times.append(time.perf_counter() - t0)
                    state = after
                    for e, start, end, bos in (p for row in rows for p in row):
                        doc = (e, int(stream.next_bos(end)) if end < stream.total else end)  # its end: an id
                        if doc in last_step and bos:
                            gaps.append(step - last_step[doc])
                        last_step[doc] = step
                ms = float(np.median(times)) * 1e3
                docs, gap = state.row_docs / state.rows, float(np.median(gaps)) if gaps else 0.0
                results[f"mix{k}_{step_tokens}_{T}_{cap}"] = {"ms_per_step": ms, "docs_per_row": docs,
                                                              "next_piece_steps": gap}
                echo(f"mix K={k}: step {step_tokens:,} tokens, rows {T}, max_doc_len {cap}: plan {ms:.2f} ms/step "
                     f"({step_tokens / ms * 1e3 / 1e6:.0f}M tokens/s), {docs:.1f} distinct documents/row, "
                     f"a document's next piece {gap:.0f} steps later (median)")
            rows, epoch, pos, docs = GreedyRows(streams, "split"), 0, 0, []
            t0 = time.perf_counter()
            for _ in range(steps * n_rows):
                pieces, epoch, pos, _ = rows.row(epoch, pos, T + 1, cap)
                # split pieces hold one document each; a piece continuing the one before it is the same document
                docs.append(sum(1 for i, p in enumerate(pieces)
                                if not (i and p[3] and p[1] == pieces[i - 1][2]) or stream.is_bos(p[1])))
            ms = (time.perf_counter() - t0) / steps * 1e3
            results[f"split_{step_tokens}_{T}_{cap}"] = {"ms_per_step": ms, "docs_per_row": float(np.mean(docs))}
            echo(f"split: step {step_tokens:,} tokens, rows {T}, max_doc_len {cap}: plan {ms:.2f} ms/step, "
                 f"{np.mean(docs):.1f} distinct documents/row")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="100000000,20000000", help="comma-separated tokens per shard")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--mix", action="store_true", help="the mix planner's cost and documents per row instead")
    parser.add_argument("--mix-docs", default="64,256,1024", help="comma-separated K (data.mix_docs) to time")
    parser.add_argument("--steps", type=int, default=20, help="--mix: optimizer steps planned per figure")
    args = parser.parse_args(argv)
    if args.mix:
        benchmark_mix(mix_docs=[int(k) for k in args.mix_docs.split(",")], steps=args.steps)
        return
    benchmark_loader(shard_tokens=[int(x) for x in args.tokens.split(",")], calls=args.calls)


if __name__ == "__main__":
    main()
