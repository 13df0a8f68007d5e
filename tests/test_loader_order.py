"""The order documents are read in: data.shuffle_first_epoch shuffles epoch 0 too (seeded), and without it the
rows are the ones main's loader made (golden digests of record #28's rows and of greedy split/crop rows, taken
at commit 2e1104b, before long_docs=mix and the switch existed)."""

import hashlib
import json
import warnings

import pytest
import torch

from speedgpt.config import load_preset
from speedgpt.data.loader import TokenLoader
from test_data_loader import BOS, make_corpus, random_lens, stream_tokens
from test_loader_record28 import make_shards
from test_loader_split import one_epoch

R28_ROWS = "1ffb1b4dbbbc29d456abd918c1609b146bc05f9ea3d0cc17e6d40006367f0627"
GREEDY_ROWS = "121a7506739526b850f1b5b58f5d2984d536f49c5ea6672f36ade84d0fa0f1da"


def digest(batches) -> str:
    h = hashlib.sha256()
    for x, y in batches:
        h.update(x.numpy().tobytes())
        h.update(y.numpy().tobytes())
    return h.hexdigest()


def test_record28_rows_are_unchanged(tmp_path):
    make_shards(tmp_path)
    files = sorted(tmp_path.glob("train_*.bin"))
    batches = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 40 batches of both ranks cross into the second epoch
        for rank in range(2):
            loader = TokenLoader(files, seq_len=16, batch_size=1, rank=rank, world_size=2, grad_accum=2,
                                 packing="record28", seed=1337, prefetch=False)
            batches += [loader.next_batch() for _ in range(40)]
    assert digest(batches) == R28_ROWS
    d = load_preset("speedrun-r28").data  # the preset reads them so: record #28's rows, in shard order
    assert d.packing == "record28" and not d.shuffle_first_epoch


def test_greedy_rows_are_unchanged(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(80, seed=12, hi=60), [40, 40])
    batches = []
    for long_docs in ("split", "crop"):
        loader = TokenLoader(files, seq_len=31, batch_size=2, long_docs=long_docs, seed=1337, prefetch=False)
        loader.on_epoch = None
        batches += [loader.next_batch(max_doc_len=(0, 24)[i % 2]) for i in range(60)]
    assert digest(batches) == GREEDY_ROWS


def test_shuffle_first_epoch_reads_every_document_once_in_a_seeded_order(tmp_path):
    files, docs = make_corpus(tmp_path, random_lens(50, seed=6, hi=40), [25, 25])
    data = stream_tokens(files)
    tokens = int((data != BOS).sum())

    def first_epoch(seed):
        return one_epoch(TokenLoader(files, seq_len=15, batch_size=2, prefetch=False, seed=seed,
                                     shuffle_first_epoch=True), tokens)[:tokens]

    shuffled = first_epoch(7)
    assert sorted(shuffled) == sorted(data[data != BOS].tolist()) and shuffled != data[data != BOS].tolist()
    for d in docs:  # documents stay whole and in order inside
        body = [t for t in d if t != BOS]
        at = shuffled.index(body[0])
        assert shuffled[at:at + len(body)] == body
    assert first_epoch(7) == shuffled and first_epoch(8) != shuffled


def test_shuffle_first_epoch_resumes_and_is_refused_otherwise(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(60, seed=9), [30, 30])

    def make(**kw):
        return TokenLoader(files, seq_len=16, batch_size=2, prefetch=False, seed=2, long_docs="mix", mix_docs=8,
                           shuffle_first_epoch=True, **kw)

    a = make()
    for _ in range(5):
        a.next_batch(max_doc_len=8)
    state = json.loads(json.dumps(a.state_dict()))
    expect = [a.next_batch(max_doc_len=8) for _ in range(5)]
    b = make()
    b.load_state_dict(state)
    assert all(torch.equal(x, bx) for (x, _), (bx, _) in zip(expect, [b.next_batch(max_doc_len=8) for _ in range(5)]))
    with pytest.raises(ValueError, match="resume with --data.shuffle_first_epoch=true"):
        TokenLoader(files, seq_len=16, batch_size=2, prefetch=False, seed=2, long_docs="mix",
                    mix_docs=8).load_state_dict(state)
