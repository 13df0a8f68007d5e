"""TokenLoader, val_batches, check_capacity on small synthetic shards.

Every non-BOS token in the synthetic data is unique, so "which tokens did a row get"
identifies exactly where in the data it came from.
"""

import json
import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch

from speedgpt.data.capacity import check_capacity, packing_stats
from speedgpt.data.greedy import GreedyRows
from speedgpt.data.loader import TokenLoader
from speedgpt.data.stream import EpochStreams, ShardCache
from speedgpt.data.val import val_batches
from speedgpt.data.shards import write_shard

BOS = 50256


def make_corpus(tmp_path, doc_lens, shard_docs, prefix="train", lead_in=0):
    """Shards of documents [BOS, unique ids...]; ``lead_in`` puts a headless document
    fragment at the start of the first shard (FineWeb shards can start mid-document)."""
    counter = iter(range(1, 10**6))
    docs = [[BOS] + [next(counter) for _ in range(n - 1)] for n in doc_lens]
    assert next(counter) < 50000  # ids stay unique and below BOS
    head = [40000 + i for i in range(lead_in)]
    files, i = [], 0
    for k, n in enumerate(shard_docs):
        toks = (head if k == 0 else []) + [t for d in docs[i : i + n] for t in d]
        i += n
        path = tmp_path / f"{prefix}_{k:06d}.bin"
        write_shard(path, toks)
        files.append(path)
    assert i == len(doc_lens)
    return files, docs


def random_lens(n, seed=0, lo=2, hi=300):
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(lo, hi, size=n)]


Row = namedtuple("Row", "start end continued")


def epoch_rows(files, seq_len):
    """The cropping greedy planner's rows of epoch 0 (one piece each): [Row(start, end, continued)]."""
    rows_of = GreedyRows(EpochStreams(ShardCache(files, BOS), seed=0), long_docs="crop")
    rows, epoch, pos = [], 0, 0
    while True:
        (piece,), epoch, pos, _ = rows_of.row(epoch, pos, seq_len + 1)
        if piece[0]:
            return rows, rows_of.streams.stream(0)
        rows.append(Row(*piece[1:]))


def stream_tokens(files):
    return np.concatenate([np.fromfile(f, dtype="<u2", offset=1024) for f in files]).astype(np.int64)


def test_rows_start_with_bos_and_targets_shift(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(150) + [700, 5, 900], [60, 60, 33])
    loader = TokenLoader(files, seq_len=64, batch_size=4, prefetch=False)
    for _ in range(40):
        x, y = loader.next_batch()
        assert x.dtype == torch.int32 and y.dtype == torch.int64 and x.shape == y.shape == (4, 64)
        assert (x[:, 0] == BOS).all()
        assert torch.equal(x[:, 1:].long(), y[:, :-1])


def test_planner_gaps_are_only_document_tails(tmp_path):
    lens = random_lens(200, seed=1)
    lens.insert(100, 1000)  # one document longer than several rows, mid-stream
    files, _ = make_corpus(tmp_path, lens, [70, 70, 61])
    rows, stream = epoch_rows(files, seq_len=127)
    data = stream_tokens(files)
    prev_end = 0
    for row in rows:
        assert row.start >= prev_end
        gap = data[prev_end : row.start]
        assert not (gap == BOS).any(), "a whole document was skipped"
        assert row.continued == (data[row.start] != BOS)
        if row.continued:
            assert row.start == prev_end  # continuations pick up exactly where the last row stopped
        prev_end = row.end
    assert len(data) - prev_end < 128  # only the epoch's last partial row is left
    stats = packing_stats(files, seq_len=127, long_docs="crop")
    covered = sum(r.end - r.start for r in rows)
    assert stats["rows"] == len(rows)
    assert covered + stats["cropped_tokens"] == len(data)
    # The long document is split over rows, never cropped.
    bos = np.flatnonzero(data == BOS)
    lo, hi = bos[100], bos[101]
    assert hi - lo == 1000
    assert sum(max(0, min(r.end, hi) - max(r.start, lo)) for r in rows) == 1000


@pytest.mark.parametrize("world_size,batch_size", [(2, 3), (3, 1)])
def test_ranks_disjoint_and_union_covers(tmp_path, world_size, batch_size):
    files, _ = make_corpus(tmp_path, random_lens(180, seed=2) + [600], [90, 91], lead_in=30)
    seq_len = 100
    rows, stream = epoch_rows(files, seq_len)
    n_batches = len(rows) // (world_size * batch_size)
    seen = []
    for rank in range(world_size):
        loader = TokenLoader(files, seq_len=seq_len, batch_size=batch_size, rank=rank, world_size=world_size,
                             long_docs="crop")
        for _ in range(n_batches):
            x, y = loader.next_batch()
            assert (x[:, 0] == BOS).all()
            full = torch.cat([x, y[:, -1:].int()], dim=1)
            for r in full.tolist():
                seen.extend(t for t in r if t != BOS)
    assert len(seen) == len(set(seen)), "ranks (or batches) overlap"
    data = stream_tokens(files)
    expected = {int(t) for r in rows[: n_batches * world_size * batch_size] for t in data[r.start : r.end] if t != BOS}
    assert set(seen) == expected


@pytest.mark.parametrize("prefetch", [False, True])
def test_exact_resume_with_schedule(tmp_path, prefetch):
    files, _ = make_corpus(tmp_path, random_lens(300, seed=3), [100, 100, 100])
    schedule = [(2, 32), (2, 32), (4, 16), (1, 64), (1, 64), (3, 32), (3, 32), (2, 8), (5, 40), (5, 40)] * 3

    def run(loader, steps):
        return [loader.next_batch(b, t) for b, t in steps]

    ref = run(TokenLoader(files, seq_len=32, batch_size=2, prefetch=prefetch, world_size=2, rank=1), schedule)
    for cut in (1, 7, 13):
        a = TokenLoader(files, seq_len=32, batch_size=2, prefetch=prefetch, world_size=2, rank=1)
        run(a, schedule[:cut])
        state = json.loads(json.dumps(a.state_dict()))  # must survive a JSON checkpoint
        a.close()
        b = TokenLoader(files, seq_len=32, batch_size=2, prefetch=prefetch, world_size=2, rank=1)
        b.next_batch()  # a fresh loader that already moved on must still land on the saved position
        b.load_state_dict(state)
        for (x, y), (rx, ry) in zip(run(b, schedule[cut:]), ref[cut:]):
            assert torch.equal(x, rx) and torch.equal(y, ry)


def test_prefetch_matches_no_prefetch(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(200, seed=4), [100, 100])
    a = TokenLoader(files, seq_len=48, batch_size=3, prefetch=True)
    b = TokenLoader(files, seq_len=48, batch_size=3, prefetch=False)
    for step in range(30):
        shape = (3, 48) if step % 7 else (2, 20)  # also after a shape the prefetcher did not guess
        xa, ya = a.next_batch(*shape)
        xb, yb = b.next_batch(*shape)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert a.state_dict() == b.state_dict()


def test_shape_change_mid_stream_continues_the_stream(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(250, seed=5) + [400], [120, 131])
    loader = TokenLoader(files, seq_len=16, batch_size=2)
    seen = []
    for b, t in [(2, 16), (8, 16), (1, 200), (4, 50), (1, 7), (2, 16)] * 4:
        x, y = loader.next_batch(b, t)
        assert x.shape == (b, t) and (x[:, 0] == BOS).all()
        seen += [v for v in torch.cat([x, y[:, -1:].int()], 1).flatten().tolist() if v != BOS]
    assert loader.epoch == 0
    assert len(seen) == len(set(seen))  # nothing handed out twice within the epoch


def test_epoch_rollover_notice_and_reshuffle(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(40, seed=6, hi=60), [10, 10, 10, 10])
    loader = TokenLoader(files, seq_len=31, batch_size=2, seed=1, long_docs="crop")
    rows, _ = epoch_rows(files, 31)
    per_epoch = len(rows) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no notice during the first pass
        for _ in range(per_epoch):
            loader.next_batch()
    assert loader.epoch == 0
    with pytest.warns(UserWarning, match=r"TokenLoader: starting epoch 2: reading the [\d,]+ tokens in 4 shards again"):
        for _ in range(2):
            loader.next_batch()
    assert loader.epoch == 1
    events = []
    loader.on_epoch = events.append
    for _ in range(per_epoch + 2):
        loader.next_batch()
    assert events == [2] and loader.epoch == 2
    # Later epochs shuffle documents, deterministically from the seed.
    fresh = EpochStreams(ShardCache(files, BOS), seed=1)
    first, again = fresh.stream(0), fresh.stream(2)
    assert len(again.seg_shard) == 40 and not np.array_equal(again.seg_lo, first.seg_lo[:1].repeat(40))
    assert np.array_equal(again.seg_lo, loader._streams.stream(2).seg_lo)


def test_errors(tmp_path):
    files, _ = make_corpus(tmp_path, [10, 10], [2])
    with pytest.raises(ValueError, match=r"shorter than one row of seq_len\+1=65 tokens"):
        TokenLoader(files, seq_len=64, batch_size=1)
    with pytest.raises(ValueError, match=r"shorter than one row of seq_len\+1=65 tokens"):
        TokenLoader(files, seq_len=8, batch_size=1).next_batch(seq_len=64)
    with pytest.raises(ValueError, match="rank=2"):
        TokenLoader(files, seq_len=4, batch_size=1, rank=2, world_size=2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty has no train shards"):
        TokenLoader(str(tmp_path / "empty"), seq_len=4, batch_size=1)
    with pytest.raises(FileNotFoundError, match="no files match"):
        TokenLoader(str(tmp_path / "missing*.bin"), seq_len=4, batch_size=1)
    other, _ = make_corpus(tmp_path, [10, 12], [2], prefix="other")
    state = TokenLoader(files, seq_len=4, batch_size=1).state_dict()
    with pytest.raises(ValueError, match="resume with the same training data"):
        TokenLoader(other, seq_len=4, batch_size=1).load_state_dict(state)


def test_directory_and_midstream_shard_start(tmp_path):
    make_corpus(tmp_path, random_lens(30, seed=7), [15, 15], lead_in=50)
    make_corpus(tmp_path, [5, 5], [2], prefix="val")
    loader = TokenLoader(str(tmp_path), seq_len=20, batch_size=2)
    assert [f.name for f in loader.files] == ["train_000000.bin", "train_000001.bin"]
    x, _ = loader.next_batch()
    assert (x[:, 0] == BOS).all()
    assert x[0, 1].item() == 40000  # the headless fragment is kept, behind an inserted BOS


def test_check_capacity(tmp_path):
    files, _ = make_corpus(tmp_path, [100] * 10, [10])  # 1000 tokens
    check_capacity(files, seq_len=99, batch_size=5, world_size=2, grad_accum=1)
    with pytest.raises(ValueError, match=r"1,000 tokens in 1 shards.*2\*1\*5\*101 = 1,010"):
        check_capacity(files, seq_len=100, batch_size=5, world_size=2, grad_accum=1)


def test_val_batches(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(60, seed=8), [30, 30], prefix="val")
    data = stream_tokens(files)
    kw = dict(seq_len=16, batch_size=2, max_tokens=16 * 2 * 2 * 5)
    per_rank = [list(val_batches(files, rank=r, world_size=2, **kw)) for r in range(2)]
    again = list(val_batches(str(tmp_path), rank=0, world_size=2, **kw))  # directory → val shards
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(per_rank[0], again))
    assert len(per_rank[0]) == 5
    targets = torch.cat([y.flatten() for batches in zip(*per_rank) for _, y in [batches[0], batches[1]]])
    # Together the ranks score exactly tokens 1..max_tokens of the stream, each once.
    assert targets.tolist() == data[1 : kw["max_tokens"] + 1].tolist()
    for batches in per_rank:
        for x, y in batches:
            assert x.dtype == torch.int32 and torch.equal(x[:, 1:].long(), y[:, :-1])
    with pytest.raises(ValueError, match=r"positive multiple .* use max_tokens=128"):
        val_batches(files, seq_len=16, batch_size=2, max_tokens=130, world_size=4)
    with pytest.raises(ValueError, match="lower max_tokens"):
        val_batches(files, seq_len=16, batch_size=1, max_tokens=16 * 10_000)
