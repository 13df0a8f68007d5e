"""TokenLoader's maximum document length (max_doc_len, a stage key) with long_docs="crop" (the records'
rows): rows of whole documents, each cut to at most max_doc_len tokens with its tail skipped, the next
piece at the next document's BOS. tests/test_loader_split.py has the default, long_docs="split"."""

import numpy as np
import pytest
import torch

from speedgpt.data.loader import TokenLoader
from test_data_loader import BOS, make_corpus, random_lens


def pieces_of(row):
    """The row's documents: split at each BOS."""
    starts = [i for i, t in enumerate(row) if t == BOS] + [len(row)]
    return [row[a:b] for a, b in zip(starts, starts[1:])]


def test_rows_are_documents_cut_to_max_doc_len(tmp_path):
    files, docs = make_corpus(tmp_path, [5, 30, 12, 40, 3, 25, 9, 60, 7, 11] * 6, [30, 30])
    loader = TokenLoader(files, seq_len=31, batch_size=2, prefetch=False, long_docs="crop")
    firsts = {d[1]: d for d in docs if len(d) > 1}  # a document by its first token after BOS (unique ids)
    seen = []
    for _ in range(6):
        inputs, targets = loader.next_batch(2, 31, max_doc_len=10)
        rows = torch.cat([inputs, targets[:, -1:]], dim=1).tolist()  # the rows' 32 tokens
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        for row in rows:
            assert row[0] == BOS
            for piece in pieces_of(row):
                if len(piece) == 1:  # a BOS alone: the row's end cut right after it
                    continue
                doc = firsts[piece[1]]
                assert len(piece) <= 10 and piece == doc[:len(piece)]  # a document's head, at most 10 tokens
                seen.append(doc)
    # in stream order, each document once (none skipped whole, none repeated)
    starts = [d[1] for d in seen]
    order = [d[1] for d in docs]
    i = order.index(starts[0])
    assert starts == order[i:i + len(starts)]


def test_max_doc_len_resumes_exactly_and_changes_between_calls(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(300, seed=3), [150, 150])
    a = TokenLoader(files, seq_len=64, batch_size=2, prefetch=True, long_docs="crop")
    plan = [(2, 64, 16), (4, 32, 16), (2, 64, 0), (2, 64, 48)]
    for args in plan:
        a.next_batch(*args)
    state = a.state_dict()
    expect = [a.next_batch(*args) for args in plan]
    b = TokenLoader(files, seq_len=64, batch_size=2, prefetch=False, long_docs="crop")
    b.load_state_dict(state)
    for (x, y), args in zip(expect, plan):
        bx, by = b.next_batch(*args)
        assert torch.equal(x, bx) and torch.equal(y, by)
    assert a.cropped_share > 0  # cut tails are counted as cropped


def test_max_doc_len_needs_greedy_packing(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(100, seed=1), [100])
    loader = TokenLoader(files, seq_len=32, batch_size=1, prefetch=False, packing="bestfit")
    with pytest.raises(ValueError, match="greedy"):
        loader.next_batch(1, 32, max_doc_len=8)


def test_no_cap_is_the_greedy_rows(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(200, seed=2), [200])
    a = TokenLoader(files, seq_len=48, batch_size=3, prefetch=False)
    b = TokenLoader(files, seq_len=48, batch_size=3, prefetch=False)
    for _ in range(5):
        x = a.next_batch()
        y = b.next_batch(3, 48, max_doc_len=0)
        assert all(np.array_equal(p.numpy(), q.numpy()) for p, q in zip(x, y))
