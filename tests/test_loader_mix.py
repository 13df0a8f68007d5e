"""long_docs="mix" (data/mix.py): rows hold the next pieces of many open documents in a seeded random order.
Every token of an epoch goes into a row exactly once, resume is exact mid-buffer and across an epoch, ranks
are disjoint, and rows of long documents hold many documents where split rows hold one or two."""

import json
import warnings

import numpy as np
import pytest
import torch

from speedgpt.data.loader import TokenLoader
from speedgpt.data.mix import MixRows
from speedgpt.data.stream import EpochStreams, ShardCache
from test_data_loader import BOS, make_corpus, random_lens, stream_tokens
from test_loader_split import pieces_of, rows_of


@pytest.fixture
def long_docs(tmp_path):
    """60 documents of 200-900 tokens (code-like: longer than the pieces) behind a headless fragment."""
    files, docs = make_corpus(tmp_path, random_lens(60, seed=1, lo=200, hi=900), [30, 30], lead_in=5)
    return files, docs


def mix_loader(files, **kw):
    args = dict(seq_len=255, batch_size=2, prefetch=False, long_docs="mix", mix_docs=16, seed=3) | kw
    loader = TokenLoader(files, **args)
    loader.on_epoch = None
    return loader


@pytest.mark.parametrize("mix_docs", [16, 100])  # 100 slots for 60 documents: an epoch drains before the next
def test_every_token_of_an_epoch_goes_into_one_row_once(long_docs, mix_docs):
    files, _ = long_docs
    streams = EpochStreams(ShardCache(files, BOS), seed=0)
    total = streams.stream(0).total
    planner = MixRows(streams, mix_docs=mix_docs, seed=3)
    state, shapes = planner.initial_state(), [(3, 256, 32), (1, 512, 0), (5, 64, 17)]
    cover = np.zeros((4, total), np.int64)  # how often each token of epochs 0-3 went into a row
    i = 0
    while state.epoch < 3:
        n_rows, row_len, cap = shapes[i % 3]
        rows, state = planner.plan(state, n_rows, row_len, cap)
        i += 1
        # a corpus with fewer documents than slots drains an epoch before it opens the next: never two copies
        # of a document open at once
        assert mix_docs < 60 or len({d[0] for d in state.docs if d is not None}) <= 1
        for row in rows:
            assert sum(end - start + bos for _, start, end, bos in row) == row_len  # full rows, no padding
            for epoch, start, end, bos in row:
                assert not cap or end - start + bos <= cap
                cover[epoch, start:end] += 1
    # epochs 0 and 1 are used up (epoch 3 opens only once epoch 1's documents are done): each token once
    assert (cover[:2] == 1).all() and cover[2:].max() <= 1
    assert state.cropped == 0


def test_loader_rows_repeat_no_token_within_an_epoch_and_skip_none(long_docs):
    files, _ = long_docs
    data = stream_tokens(files)
    ids = data[data != BOS]
    loader, first, every = mix_loader(files), [], []
    while loader.epoch < 3:
        x, y = loader.next_batch(max_doc_len=32)
        assert (x[:, 0] == BOS).all() and torch.equal(x[:, 1:].long(), y[:, :-1])
        tokens = [t for row in rows_of(x, y) for t in row if t != BOS]
        every += tokens
        if loader.epoch == 0:  # batches that hold epoch 0 alone: no token twice
            first += tokens
            assert len(first) == len(set(first))
    # epochs 0 and 1 are done once epoch 3 opens: every token came at least twice, none more than 4 times
    counts = np.bincount(np.array(every), minlength=int(ids.max()) + 1)[ids]
    assert len(first) > 0.7 * ids.size and counts.min() == 2 and counts.max() <= 4
    assert loader.cropped_share == 0.0


def test_pieces_are_spans_of_one_document_in_order_and_spread_over_rows(long_docs):
    files, docs = long_docs
    where = {t: (i, j) for i, d in enumerate(docs) for j, t in enumerate(d) if t != BOS}
    loader = mix_loader(files)
    next_token = {}  # document -> the position its next piece must start at
    rows_of_doc: dict[int, set] = {}
    for b in range(8):
        for r, row in enumerate(rows_of(*loader.next_batch(max_doc_len=32))):
            for piece in pieces_of(row):
                if not piece or piece[0] not in where:  # a lone BOS closing a row; the headless fragment
                    continue
                doc, j = where[piece[0]]
                assert [where[t] for t in piece] == [(doc, j + k) for k in range(len(piece))]
                assert j == next_token.get(doc, 1)  # pieces of a document come in order, none skipped
                next_token[doc] = j + len(piece)
                rows_of_doc.setdefault(doc, set()).add((b, r))
    spread = [len(rows) for doc, rows in rows_of_doc.items() if next_token[doc] > 200]
    assert spread and min(spread) >= 4  # a document's pieces lie in many rows, not side by side


def test_rows_of_long_documents_hold_many_documents(long_docs):
    files, docs = long_docs
    doc_of = {t: i for i, d in enumerate(docs) for t in d if t != BOS} | {40000 + i: -1 for i in range(5)}

    def docs_per_row(loader):
        counts = []
        for _ in range(6):
            rows = rows_of(*loader.next_batch(2, 1023, 128))
            counts += [len({doc_of[t] for t in row if t in doc_of}) for row in rows]
        return np.mean(counts)

    mix = mix_loader(files)
    mixed = docs_per_row(mix)
    assert mixed >= 8 and docs_per_row(TokenLoader(files, seq_len=1023, batch_size=2, prefetch=False)) < 4
    rows, row_docs = mix.row_docs
    assert rows == 12 and row_docs / rows == pytest.approx(mixed)  # the loader's own count (the metric)


@pytest.mark.parametrize("prefetch", [False, True])
def test_exact_resume_mid_buffer_and_across_an_epoch(long_docs, prefetch):
    files, _ = long_docs
    plan = [(4, 512, 32), (2, 1024, 0), (8, 128, 20)] * 20  # about 3 epochs of the ~33K tokens
    run = lambda loader, steps: [loader.next_batch(b, t, max_doc_len=m) for b, t, m in steps]  # noqa: E731
    full = mix_loader(files, prefetch=prefetch)
    ref = run(full, plan)
    assert full.epoch >= 2
    probe, cuts = mix_loader(files), {}
    for i in range(len(plan)):
        run(probe, plan[i:i + 1])
        state = probe.state_dict()
        if any(d is not None and d[1] > 0 for d in state["mix"]["open"]) and state["mix"]["turn"]:
            cuts.setdefault("mid_buffer", i + 1)
        if state["epoch"] == 1 and any(d is not None and d[0] == 0 for d in state["mix"]["open"]):
            cuts.setdefault("across_epochs", i + 1)  # epoch 0's documents still open while epoch 1 is read
    assert set(cuts) == {"mid_buffer", "across_epochs"}
    for cut in cuts.values():
        a = mix_loader(files, prefetch=prefetch)
        run(a, plan[:cut])
        state = json.loads(json.dumps(a.state_dict()))
        a.close()
        b = mix_loader(files, prefetch=prefetch)
        b.load_state_dict(state)
        for (x, y), (rx, ry) in zip(run(b, plan[cut:]), ref[cut:]):
            assert torch.equal(x, rx) and torch.equal(y, ry)
        assert b.row_docs == full.row_docs


def test_ranks_are_disjoint_and_together_are_one_rank(long_docs):
    files, _ = long_docs
    one = mix_loader(files, batch_size=4)
    ranks = [mix_loader(files, batch_size=2, rank=r, world_size=2) for r in range(2)]
    for _ in range(10):
        x, _ = one.next_batch(max_doc_len=32)
        parts = [loader.next_batch(max_doc_len=32)[0] for loader in ranks]
        assert torch.equal(torch.cat(parts), x)
        assert not {t for t in parts[0].flatten().tolist() if t != BOS} & {t for t in parts[1].flatten().tolist()}
    assert ranks[0].state_dict() == ranks[1].state_dict()


def test_rows_are_a_function_of_the_seed(long_docs):
    files, _ = long_docs
    batches = {s: [mix_loader(files, seed=s).next_batch(max_doc_len=32)[0] for _ in range(1)] for s in (3, 4)}
    again = mix_loader(files, seed=3).next_batch(max_doc_len=32)[0]
    assert torch.equal(again, batches[3][0]) and not torch.equal(batches[3][0], batches[4][0])


def test_resume_and_combinations_refused(long_docs):
    files, _ = long_docs
    state = mix_loader(files).state_dict()
    with pytest.raises(ValueError, match="resume with --data.mix_docs=16"):
        mix_loader(files, mix_docs=8).load_state_dict(state)
    with pytest.raises(ValueError, match="resume with --data.long_docs=mix"):
        TokenLoader(files, seq_len=255, batch_size=2, prefetch=False, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="packing='greedy' only"):
        mix_loader(files, packing="bestfit")
    with pytest.raises(ValueError, match="on_bad_shard='skip' works with"):
        mix_loader(files, on_bad_shard="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert mix_loader(files).preview_docs_per_row(2, 1023, 128) >= 8


def test_a_run_says_documents_per_row_at_start_and_in_its_metrics(tiny_cfg, text_shards):
    from types import SimpleNamespace

    from speedgpt.config import apply_overrides
    from speedgpt.planner import plan_run
    from speedgpt.train.build import data_epoch_lines, mix_preview
    from speedgpt.train.progress import ProgressLog

    cfg = apply_overrides(tiny_cfg, ["--data.long_docs=mix", "--data.mix_docs=32", "--data.max_doc_len=16"])
    loader = mix_loader(sorted(text_shards.glob("train_*.bin")), seq_len=64, batch_size=8, mix_docs=32)
    lines = data_epoch_lines(cfg, plan_run(cfg), loader.corpus_tokens, mix_preview(plan_run(cfg), loader))
    start = [line for line in lines if "long_docs=mix" in line]
    assert len(start) == 1 and start[0].startswith("data: rows mix pieces of 32 open documents (long_docs=mix); "
                                                   "distinct documents per row in a micro-batch planned at the start")
    assert 4 <= float(start[0].rsplit(" ", 1)[1]) <= 5  # rows of 65 tokens: 4-5 pieces of <= 16
    # What the loop hands the progress log between two logging steps (the model's and optimizers' parts faked)
    records, printed = [], []
    progress = ProgressLog(cfg.train, SimpleNamespace(log=records.append), printed.append, model=None,
                           optimizers=SimpleNamespace(muon=SimpleNamespace(param_groups=[{"lr": 0.1}])),
                           loader=loader, guard=SimpleNamespace(mode="abort"),
                           grad_sync=SimpleNamespace(comm_wait_ms=lambda: None), device=torch.device("cpu"),
                           peak=None, world_size=1, has_experts=False)
    for step in (1, 2, 3):
        loader.next_batch(8, 64, 16 if step < 3 else 64)
        if step != 2:
            progress.log_train(step, 512 * step, 0.1 * step, [torch.tensor(3.0)] * step, 64)
    # rows of 65 tokens hold 4-5 pieces of <= 16, 1-2 of <= 64
    assert records[0]["docs_per_row"] >= 4 and records[1]["docs_per_row"] < records[0]["docs_per_row"]
    assert records[1]["docs_per_row"] == (loader.row_docs[1] - 8 * records[0]["docs_per_row"]) / 16
    assert " docs/row" in printed[0]


@pytest.mark.parametrize("overrides,message", [
    (["--data.long_docs=mix", "--data.packing=record28"], "data.long_docs=mix works with data.packing=greedy only"),
    (["--data.long_docs=mix", "--data.mix_docs=0"], "data.mix_docs=0 must be at least 1"),
    (["--data.long_docs=mix", "--data.on_bad_shard=skip"], "data.on_bad_shard=skip works with"),
    (["--data.max_doc_len=64", "--data.packing=bestfit"], "data.max_doc_len=64 must be >= 0 and works with"),
    (["--data.long_docs=mixed"], "data.long_docs='mixed' must be split, crop or mix"),
])
def test_config_refuses_what_mix_cannot_do(tiny_cfg, overrides, message):
    from speedgpt.config import ConfigError, apply_overrides
    from speedgpt.config.validate import check_config

    with pytest.raises(ConfigError, match=message):
        check_config(apply_overrides(tiny_cfg, overrides))


def test_data_max_doc_len_caps_the_stages_that_set_none(tiny_cfg):
    from speedgpt.config import apply_overrides
    from speedgpt.stages import stage_plan

    assert stage_plan(apply_overrides(tiny_cfg, ["--data.max_doc_len=48"])).stages[0].max_doc_len == 48
    table = apply_overrides(tiny_cfg, ["--data.max_doc_len=48", "--train.stages=[{share=0.5, max_doc_len=16}, "
                                       "{share=0.5}]"])
    assert [s.max_doc_len for s in stage_plan(table).stages] == [16, 48]


def test_bos_from_is_many_next_bos(long_docs):
    files, _ = long_docs
    streams = EpochStreams(ShardCache(files, BOS), seed=0)
    for epoch in (0, 1):  # shards in order; documents shuffled (a segment per document)
        stream = streams.stream(epoch)
        for g in (0, 1, 17, stream.total // 2, stream.total - 3):
            expect, at = [], g
            while (at := stream.next_bos(at)) < stream.total and len(expect) < 9:
                expect.append(at)
                at += 1
            assert stream.bos_from(g, 9).tolist() == expect
