"""data.packing = "record28": training rows cut as record #28's distributed_data_generator cuts them
(align_to_bos=True), checked against a transcription of that generator on small shards."""

from __future__ import annotations

import numpy as np
import pytest

from speedgpt.data.loader import TokenLoader
from speedgpt.data.shards import write_shard

BOS = 50256


def record_rows(shards: list[np.ndarray], seq_len: int, grad_accum: int, world_size: int, rank: int):
    """The record's generator, transcribed: per step a token window of 2 x the step's tokens, a change of
    shard when it does not fit, and per micro-step world_size BOS-started rows of seq_len + 1 tokens."""
    batch = seq_len * world_size
    files = iter(shards)
    tokens, pos = next(files), 0
    while True:
        window = grad_accum * 2 * batch
        if pos + window + 1 >= len(tokens):
            tokens, pos = next(files, None), 0  # no shard left: the record's data ends here
            if tokens is None:
                return
        for _ in range(grad_accum):
            bounds = np.flatnonzero(tokens[pos:pos + window] == BOS) + pos
            start, starts = int(bounds[0]), []
            for end in bounds[1:]:
                if end - start >= seq_len:
                    starts.append(start)
                    if len(starts) == world_size:
                        consumed = int(end) - pos
                        break
                    start = int(end)
            else:
                raise AssertionError("window too small for the reference")
            s = starts[rank]
            yield tokens[s:s + seq_len + 1]
            pos += consumed
            window -= consumed


def make_shards(tmp_path, seed=0):
    """Two shards of documents of 2-12 tokens, each shard with one of 20 (longer than a row of 16 + 1:
    the record drops its tail). Short enough for the record's token window to find every row start."""
    rng = np.random.default_rng(seed)
    shards = []
    for i, n_docs in enumerate((70, 60)):
        lengths = rng.integers(2, 13, size=n_docs)
        lengths[n_docs // 3] = 20
        docs = [np.concatenate([[BOS], rng.integers(0, 1000, size=k - 1)]) for k in lengths]
        toks = np.concatenate(docs).astype(np.uint16)
        write_shard(tmp_path / f"train_{i:06d}.bin", toks)
        shards.append(toks)
    return shards


@pytest.mark.parametrize("world_size, grad_accum", [(1, 2), (2, 1)])
def test_rows_match_the_records_generator(tmp_path, world_size, grad_accum):
    shards = make_shards(tmp_path)
    seq = 16
    for rank in range(world_size):
        ref = record_rows(shards, seq, grad_accum, world_size, rank)
        loader = TokenLoader(sorted(tmp_path.glob("train_*.bin")), seq_len=seq, batch_size=1, rank=rank,
                             world_size=world_size, prefetch=False, packing="record28", grad_accum=grad_accum)
        n = 0
        for expected in ref:
            x, y = loader.next_batch()
            got = np.concatenate([x[0].numpy(), y[0, -1:].numpy()])
            assert np.array_equal(got, expected.astype(np.int64)), f"row {n}"
            n += 1
        assert n > 20  # ran to the end of the second shard: the shard change and long documents were covered


def test_default_rule_is_unchanged(tmp_path):
    make_shards(tmp_path)
    files = sorted(tmp_path.glob("train_*.bin"))
    a = TokenLoader(files, seq_len=16, batch_size=2, prefetch=False)
    b = TokenLoader(files, seq_len=16, batch_size=2, prefetch=False, packing="greedy", grad_accum=4)
    for _ in range(30):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    r = TokenLoader(files, seq_len=16, batch_size=2, prefetch=False, packing="record28")
    assert not all(np.array_equal(a.next_batch()[0], r.next_batch()[0]) for _ in range(10))
