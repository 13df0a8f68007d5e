"""long_docs="split" (the default): every token of an epoch goes into a row exactly once, long documents and
the documents cut by a row's end go on as further pieces (each behind a BOS), resume is exact across a
split document and across an epoch, and later epochs shuffle documents."""

import json
import warnings

import numpy as np
import pytest
import torch

from speedgpt.data.capacity import packing_stats
from speedgpt.data.loader import TokenLoader
from speedgpt.data.stream import EpochStreams, ShardCache
from test_data_loader import BOS, make_corpus, random_lens, stream_tokens


def rows_of(x, y):
    """The batch's rows with their last target: (B, T + 1) lists."""
    return torch.cat([x, y[:, -1:].int()], dim=1).tolist()


def pieces_of(row):
    """Each piece of a row: the tokens after one BOS, up to the next."""
    starts = [i for i, t in enumerate(row) if t == BOS] + [len(row)]
    return [row[a + 1:b] for a, b in zip(starts, starts[1:])]


def one_epoch(loader, tokens, **shape):
    """Batches until the loader has handed out one epoch's tokens (ids are unique and not BOS)."""
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while len(seen) < tokens:
            seen += [t for row in rows_of(*loader.next_batch(**shape)) for t in row if t != BOS]
    return seen


@pytest.mark.parametrize("max_doc", [0, 7, 40])
def test_every_token_of_an_epoch_is_read_once_in_stream_order(tmp_path, max_doc):
    lens = random_lens(120, seed=1, hi=90) + [400]  # one document longer than several rows
    files, _ = make_corpus(tmp_path, lens, [60, 61], lead_in=13)
    data = stream_tokens(files)
    tokens = int((data != BOS).sum())
    loader = TokenLoader(files, seq_len=31, batch_size=3, prefetch=False)
    seen = []
    while not loader.epoch:
        x, y = loader.next_batch(max_doc_len=max_doc)
        assert (x[:, 0] == BOS).all() and torch.equal(x[:, 1:].long(), y[:, :-1])
        for row in rows_of(x, y):
            for piece in pieces_of(row):
                assert not max_doc or len(piece) + 1 <= max_doc  # a piece and its BOS fit the cap
                seen += piece
        if loader.epoch:
            break
    first = seen[:tokens]
    assert first == data[data != BOS].tolist()  # the whole epoch, in order: nothing skipped or repeated
    assert loader.cropped_share == 0.0


def test_pieces_are_contiguous_spans_of_one_document(tmp_path):
    files, docs = make_corpus(tmp_path, [5, 30, 12, 40, 3, 25, 9, 60, 7, 11] * 4, [20, 20])
    by_token = {t: (i, j) for i, d in enumerate(docs) for j, t in enumerate(d) if t != BOS}
    loader = TokenLoader(files, seq_len=31, batch_size=2, prefetch=False)
    for _ in range(10):
        for row in rows_of(*loader.next_batch(max_doc_len=10)):
            assert row[0] == BOS
            for piece in pieces_of(row):
                where = [by_token[t] for t in piece]
                assert len({d for d, _ in where}) <= 1  # one document per piece
                assert [j for _, j in where] == list(range(where[0][1], where[0][1] + len(where))) if where else True


def test_continued_pieces_without_bos_keep_the_stream(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(80, seed=2, hi=70), [80])
    data = stream_tokens(files)
    loader = TokenLoader(files, seq_len=24, batch_size=2, prefetch=False, continued_bos=False)
    stream = []
    for _ in range(20):
        for row in rows_of(*loader.next_batch(max_doc_len=8)):
            stream += row
    # Rows are consecutive stream spans with nothing inserted; the cap puts no BOS in either.
    assert stream == data[: len(stream)].tolist()


def test_split_crops_nothing_where_crop_loses_most(tmp_path):
    lens = random_lens(60, seed=3, lo=200, hi=900)  # long documents, as code files are
    files, _ = make_corpus(tmp_path, lens, [30, 30])
    crop = packing_stats(files, seq_len=255, long_docs="crop", max_doc_len=64)
    split = packing_stats(files, seq_len=255, max_doc_len=64)
    assert crop["cropped_share"] > 0.7
    assert split["cropped_share"] == 0.0 and split["cropped_tokens"] == 0


@pytest.mark.parametrize("prefetch", [False, True])
def test_exact_resume_across_a_split_document_and_an_epoch(tmp_path, prefetch):
    lens = random_lens(40, seed=4, hi=50) + [300] + random_lens(20, seed=5, hi=50)
    files, _ = make_corpus(tmp_path, lens, [30, 31])
    total = int(stream_tokens(files).size)
    plan = [(2, 32, 16), (2, 32, 16), (4, 16, 0), (1, 64, 24)] * 12  # past one epoch (~1,500 tokens)

    def run(loader, steps):
        return [loader.next_batch(b, t, max_doc_len=m) for b, t, m in steps]

    def make():
        loader = TokenLoader(files, seq_len=32, batch_size=2, prefetch=prefetch, seed=3)
        loader.on_epoch = None
        return loader

    full = make()
    ref = run(full, plan)
    assert full.epoch >= 1
    probe, cuts = make(), {}
    for i in range(len(plan)):
        run(probe, plan[i:i + 1])
        st = probe.state_dict()
        pos_is_bos = probe._streams.stream(st["epoch"]).is_bos(st["position"]) if st["position"] < total else True
        if not pos_is_bos:
            cuts.setdefault("mid_document", i + 1)
        if st["epoch"] == 1:
            cuts.setdefault("next_epoch", i + 1)
    assert set(cuts) == {"mid_document", "next_epoch"}
    for cut in cuts.values():
        a = make()
        run(a, plan[:cut])
        state = json.loads(json.dumps(a.state_dict()))
        a.close()
        b = make()
        b.load_state_dict(state)
        for (x, y), (rx, ry) in zip(run(b, plan[cut:]), ref[cut:]):
            assert torch.equal(x, rx) and torch.equal(y, ry)


def test_later_epochs_shuffle_documents_and_read_each_once(tmp_path):
    files, docs = make_corpus(tmp_path, random_lens(50, seed=6, hi=40), [25, 25])
    data = stream_tokens(files)
    tokens = int((data != BOS).sum())
    loader = TokenLoader(files, seq_len=15, batch_size=2, prefetch=False, seed=7)
    seen = one_epoch(loader, 3 * tokens)
    epochs = [seen[i * tokens:(i + 1) * tokens] for i in range(3)]
    # each epoch holds every token once; epoch 0 in stream order, later ones in another document order
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert epochs[0] == data[data != BOS].tolist()
    firsts = [[t for t in e if t in {d[1] for d in docs if len(d) > 1}] for e in epochs]
    assert firsts[1] != firsts[0] and firsts[2] != firsts[1]
    # documents stay whole and in order inside (no token order changes within a document)
    pos = {t: i for i, t in enumerate(epochs[0])}
    for d in docs:
        body = [t for t in d if t != BOS]
        order = [i for i, t in enumerate(epochs[1]) if t in set(body)]
        assert order == list(range(order[0], order[0] + len(body)))
        assert [epochs[1][i] for i in order] == sorted(body, key=pos.get)
    # the same seed gives the same order, another seed another
    again = one_epoch(TokenLoader(files, seq_len=15, batch_size=2, prefetch=False, seed=7), 2 * tokens)
    other = one_epoch(TokenLoader(files, seq_len=15, batch_size=2, prefetch=False, seed=8), 2 * tokens)
    assert again[tokens:2 * tokens] == epochs[1] and other[tokens:2 * tokens] != epochs[1]


def test_shuffle_groups_bound_the_shards_kept_loaded(tmp_path):
    files, _ = make_corpus(tmp_path, [20] * 40, [10, 10, 10, 10])  # shards of 200 tokens
    streams = EpochStreams(ShardCache(files, BOS), seed=0, group_tokens=400)
    stream = streams.stream(1)
    shard_runs = [int(s) for s in stream.seg_shard]
    groups = [set(shard_runs[i * 20:(i + 1) * 20]) for i in range(2)]
    assert all(len(g) == 2 for g in groups) and not groups[0] & groups[1]  # two groups of two shards
    assert streams.shards.capacity == 3
    assert stream.total == 800


def test_bestfit_split_puts_cut_tails_back(tmp_path):
    lens = random_lens(200, seed=8, hi=120) + [333]
    files, _ = make_corpus(tmp_path, lens, [100, 101])
    data = stream_tokens(files)
    tokens = int((data != BOS).sum())
    loader = TokenLoader(files, seq_len=63, batch_size=4, packing="bestfit", buffer_docs=30, prefetch=False)
    seen = one_epoch(loader, tokens - 64 * 30 * 2)  # best-fit's buffer holds the epoch's last documents back
    assert len(seen) == len(set(seen)) and loader.cropped_share == 0.0


def test_resume_refuses_another_long_docs(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(60, seed=9), [60])
    state = TokenLoader(files, seq_len=16, batch_size=1, prefetch=False).state_dict()
    with pytest.raises(ValueError, match="resume with --data.long_docs=split"):
        TokenLoader(files, seq_len=16, batch_size=1, prefetch=False, long_docs="crop").load_state_dict(state)
    old = {k: v for k, v in state.items() if k not in ("long_docs", "continued_bos", "shuffle")}
    with pytest.raises(ValueError, match="resume with --data.long_docs=crop"):  # states from before the switch
        TokenLoader(files, seq_len=16, batch_size=1, prefetch=False).load_state_dict(old)


def test_a_shard_that_breaks_in_a_shuffled_epoch_is_skipped_and_resumes_exactly(tmp_path):
    """Its documents lie scattered over the epoch's stream: taking them out must leave every other position
    where a resumed run (which lays out the stream without them) finds it."""
    files, _ = make_corpus(tmp_path, [30] * 60, [10] * 6)  # six shards of 300 tokens

    def make():
        loader = TokenLoader(files, seq_len=31, batch_size=2, prefetch=False, seed=5, on_bad_shard="skip")
        loader._streams.group_tokens = 600  # groups of two shards, so shards are evicted and loaded again
        loader.on_epoch = None
        return loader

    full = make()
    last_group = [int(i) for i in full._streams.stream(1).seg_shard[-20:]]
    bad = files[last_group[0]]
    states, batches = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(60):
            if full.epoch == 1 and bad.stat().st_size > 1224:
                bad.write_bytes(bad.read_bytes()[:1224])  # breaks while epoch 2 reads its first group
            states.append(full.state_dict())
            batches.append(full.next_batch()[0])
    assert full.skipped_shards == {bad.name: 1}
    for start in (30, 45, 59):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resumed = make()
            resumed.load_state_dict(states[start])
            again = [resumed.next_batch()[0] for _ in range(60 - start)]
        assert all(torch.equal(a, b) for a, b in zip(again, batches[start:]))


def test_position_without_spans():
    from speedgpt.data.stream import position_without

    spans = [(10, 20), (30, 35), (50, 60)]
    assert [position_without(spans, p) for p in (0, 10, 15, 20, 25, 32, 40, 55, 70)] == [0, 10, 10, 10, 15, 20, 25, 35,
                                                                                         45]


def test_run_start_prints_tokens_read_against_the_corpus_and_warns_past_one_epoch(tmp_path, tiny_cfg, capsys):
    from speedgpt.config import apply_overrides
    from speedgpt.train.loop import Trainer

    files, _ = make_corpus(tmp_path, random_lens(200, seed=10), [200])  # ~30K tokens
    val, _ = make_corpus(tmp_path, random_lens(200, seed=10), [200], prefix="val")  # a file of its own: none shared
    corpus = int(stream_tokens(files).size)
    for steps, warned in ((2, False), (200, True)):
        cfg = apply_overrides(tiny_cfg, [f"--data.train_files={files[0]}", f"--data.val_files={val[0]}",
                                         f"--train.steps={steps}", "--train.val_every=0"])
        Trainer(cfg, run_dir=tmp_path / f"run{steps}").setup()
        out = capsys.readouterr().out
        need = steps * cfg.train.batch_tokens
        assert f"data: {need:,} tokens in {steps} steps, from training shards of {corpus:,} tokens" in out
        assert ("warning: more than one epoch of data: from about step "
                f"{corpus // cfg.train.batch_tokens} on") in out if warned else "more than one epoch" not in out


@pytest.mark.parametrize("rows,world_size,batch_size", [(15, 2, 4), (6, 4, 1), (3, 4, 2), (12, 3, 5), (8, 1, 3)])
def test_validation_rows_are_the_same_whatever_the_world_size(tmp_path, rows, world_size, batch_size):
    from speedgpt.data.val import rank_val_batches

    files, _ = make_corpus(tmp_path, random_lens(40, seed=11), [40], prefix="val")
    data = stream_tokens(files)
    seq = 16
    per_rank = [list(rank_val_batches(files, seq_len=seq, batch_size=batch_size, rows=rows, rank=r,
                                      world_size=world_size)) for r in range(world_size)]
    assert len({len(b) for b in per_rank}) == 1  # every rank runs the same number of forwards
    scored = []
    for batches in per_rank:
        for x, y, real in batches:
            assert x.shape == y.shape and x.shape[0] <= batch_size and torch.equal(x[:, 1:].long(), y[:, :-1])
            if real:
                assert real == x.shape[0]
                scored += y.flatten().tolist()
    assert sorted(scored) == sorted(data[1:rows * seq + 1].tolist())  # every row once, nothing else


@pytest.mark.parametrize("rows,world_size,batch_size", [(15, 2, 4), (6, 4, 1), (3, 4, 2), (12, 3, 5), (8, 1, 3),
                                                        (40, 1, 1), (40, 4, 1), (9, 4, 2)])
def test_a_validation_warmup_meets_every_batch_shape_of_every_rank(tmp_path, rows, world_size, batch_size):
    """The compile warmup's validation (Validator.loss(warmup=True)) runs the batches batches_of_each_shape picks,
    one index set for all ranks (collectives stay matched): each rank meets every batch shape a whole validation
    gives it, and a validation of one shape runs one batch."""
    from speedgpt.data.val import batches_of_each_shape, rank_val_batches

    files, _ = make_corpus(tmp_path, random_lens(40, seed=11), [40], prefix="val")
    chosen = batches_of_each_shape(rows, world_size, batch_size)
    for r in range(world_size):
        shapes = lambda only: {x.shape for x, _, _ in rank_val_batches(  # noqa: E731
            files, seq_len=16, batch_size=batch_size, rows=rows, rank=r, world_size=world_size, only=only)}
        assert shapes(chosen) == shapes(None)
        assert len(list(rank_val_batches(files, seq_len=16, batch_size=batch_size, rows=rows, rank=r,
                                         world_size=world_size, only=chosen))) == len(chosen)
    if rows % (world_size * batch_size) == 0:  # every batch of every rank full: one shape
        assert chosen == {0}
