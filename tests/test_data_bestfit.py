"""Best-fit packing (data.packing = "bestfit"): BOS-aligned full rows, hand-counted crops, exact resume.

The synthetic documents of test_data_loader.make_corpus carry unique token ids, so every row
can be taken apart into the document pieces it was made of.
"""

import json

import pytest
import torch

from speedgpt.data.capacity import packing_stats
from speedgpt.data.loader import TokenLoader
from test_data_loader import BOS, make_corpus, random_lens


def doc_pieces(row: list[int], docs: list[list[int]]) -> list[tuple[int, int, int]]:
    """Split a row at its BOS tokens; each part must be a BOS plus a contiguous run of one document:
    (document, first id index, length). Fails on anything else (padding, foreign tokens)."""
    where = {tok: (d, i) for d, doc in enumerate(docs) for i, tok in enumerate(doc) if tok != BOS}
    assert row[0] == BOS
    parts, out = [], []
    for tok in row:
        if tok == BOS:
            parts.append([])
        else:
            parts[-1].append(tok)
    for part in parts:
        if not part:
            continue  # a piece cropped to its BOS alone
        d, i = where[part[0]]
        assert part == docs[d][i : i + len(part)], "a row part is not a contiguous run of one document"
        out.append((d, i, len(part)))
    return out


def test_hand_counted_rows_and_cropped_share(tmp_path):
    # Documents of 6, 3, 8, 4, 5 and 2 tokens (BOS included), rows of 10, a buffer of 3 documents:
    #  row 1: buffer {6, 3, 8}: 8 fits; refill {6, 3, 4}: nothing fits 2 -> crop the 3 to 2 (1 cropped)
    #  row 2: refill {6, 4, 5}: 6; refill {4, 5, 2}: 4 fills the row exactly
    #  row 3: refill (next pass) {5, 2, 6}: 6; refill {5, 2, 3}: 3; refill {5, 2, 8}: crop the 2 to 1 (1 more)
    # long_docs="crop": the cropping rows of nanochat and the records; the next pass reads the shard in order.
    files, docs = make_corpus(tmp_path, [6, 3, 8, 4, 5, 2], [6])
    crop = dict(long_docs="crop", epoch_shuffle="shards")
    loader = TokenLoader(files, seq_len=9, batch_size=1, prefetch=False, packing="bestfit", buffer_docs=3,
                         seed=0, **crop)
    loader.on_epoch = None
    rows = []
    for _ in range(3):
        x, y = loader.next_batch()
        rows.append(torch.cat([x, y[:, -1:].int()], 1)[0].tolist())
    assert rows[0] == docs[2] + docs[1][:2]
    assert rows[1] == docs[0] + docs[3]
    assert rows[2] == docs[0] + docs[1] + docs[5][:1]
    assert loader.cropped_share == pytest.approx(2 / 32)
    # Greedy on the same data crops 7 (the 8-token document cut after its BOS) and 1 in the first pass
    # and 7 again in the second: 15 of 45 tokens.
    greedy = TokenLoader(files, seq_len=9, batch_size=1, prefetch=False, seed=0, **crop)
    greedy.on_epoch = None
    for _ in range(3):
        greedy.next_batch()
    assert greedy.cropped_share == pytest.approx(15 / 45)


def test_rows_start_at_bos_are_full_and_made_of_document_runs(tmp_path):
    lens = random_lens(300, seed=7, hi=120) + [333]  # one document longer than several rows
    files, docs = make_corpus(tmp_path, lens, [150, 151])
    loader = TokenLoader(files, seq_len=63, batch_size=4, packing="bestfit", buffer_docs=50, long_docs="crop")
    seen = []
    for _ in range(40):
        x, y = loader.next_batch()
        assert x.shape == (4, 63) and (x[:, 0] == BOS).all()
        assert torch.equal(x[:, 1:].long(), y[:, :-1])
        for row in torch.cat([x, y[:, -1:].int()], 1).tolist():
            assert len(row) == 64  # full: no padding token exists, every position is data or a row's BOS
            for d, i, n in doc_pieces(row, docs):
                seen.extend(docs[d][i : i + n])
    assert len(seen) == len(set(seen)), "a token was trained twice within the pass"
    assert 0 < loader.cropped_share < 0.2


def test_long_documents_are_split_never_dropped(tmp_path):
    files, docs = make_corpus(tmp_path, [35, 4, 4], [3])
    loader = TokenLoader(files, seq_len=9, batch_size=1, prefetch=False, packing="bestfit", buffer_docs=2)
    loader.on_epoch = None
    seen = []
    for _ in range(5):
        x, y = loader.next_batch()
        seen += [t for t in torch.cat([x, y[:, -1:].int()], 1)[0].tolist() if t != BOS]
    assert set(docs[0][1:]) <= set(seen)


@pytest.mark.parametrize("prefetch", [False, True])
def test_exact_resume_mid_epoch(tmp_path, prefetch):
    files, _ = make_corpus(tmp_path, random_lens(300, seed=3), [100, 100, 100])
    schedule = [(2, 32), (2, 32), (4, 16), (1, 64), (3, 32), (3, 32), (2, 8), (5, 40)] * 3

    def make():
        return TokenLoader(files, seq_len=32, batch_size=2, prefetch=prefetch, world_size=2, rank=1,
                           packing="bestfit", buffer_docs=40)

    def run(loader, steps):
        return [loader.next_batch(b, t) for b, t in steps]

    ref_loader = make()
    ref = run(ref_loader, schedule)
    for cut in (1, 7, 13):
        a = make()
        run(a, schedule[:cut])
        state = json.loads(json.dumps(a.state_dict()))  # must survive a JSON checkpoint
        assert 30 <= len(state["buffer"]) <= 40  # refilled before each pick, so a few short after a row
        a.close()
        b = make()
        b.next_batch()  # a loader that already moved on must still land on the saved position
        b.load_state_dict(state)
        for (x, y), (rx, ry) in zip(run(b, schedule[cut:]), ref[cut:]):
            assert torch.equal(x, rx) and torch.equal(y, ry)
        assert b.state_dict() == ref_loader.state_dict()


def test_ranks_are_disjoint(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(200, seed=9), [100, 100])
    seen = []
    for rank in range(3):
        loader = TokenLoader(files, seq_len=50, batch_size=2, rank=rank, world_size=3, packing="bestfit",
                             buffer_docs=20)
        for _ in range(10):
            x, y = loader.next_batch()
            seen += [t for t in torch.cat([x, y[:, -1:].int()], 1).flatten().tolist() if t != BOS]
    assert len(seen) == len(set(seen))


def test_resume_refuses_another_packing(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(50), [50])
    state = TokenLoader(files, seq_len=16, batch_size=1, prefetch=False).state_dict()
    with pytest.raises(ValueError, match="resume with --data.packing=greedy"):
        TokenLoader(files, seq_len=16, batch_size=1, prefetch=False, packing="bestfit").load_state_dict(state)
    with pytest.raises(ValueError, match="packing='first' must be one of greedy, bestfit"):
        TokenLoader(files, seq_len=16, batch_size=1, packing="first")


def test_packing_stats_bestfit_crops_less(tmp_path):
    files, _ = make_corpus(tmp_path, random_lens(400, seed=11, hi=200), [400])
    greedy = packing_stats(files, seq_len=127, long_docs="crop")
    best = packing_stats(files, seq_len=127, packing="bestfit", buffer_docs=100, long_docs="crop")
    assert best["cropped_share"] < greedy["cropped_share"]


def test_trainer_logs_cropped_share_and_resumes_exactly(tmp_path, tiny_cfg):
    import shutil

    from speedgpt.config import apply_overrides
    from speedgpt.rundir.checkpoint import list_checkpoints
    from speedgpt.train.loop import train

    cfg = apply_overrides(tiny_cfg, ["--data.packing=bestfit", "--train.steps=4", "--train.val_every=0",
                                     "--train.log_every=1", "--train.checkpoint_every=2", "--train.keep_checkpoints=3"])
    full = train(cfg, run_dir=tmp_path / "run", quiet=True)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["cropped_share"] for r in records if "train_loss" in r]
    assert len(shares) == 4 and all(0 <= s < 1 for s in shares)
    shutil.rmtree(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])  # crashed after step 2's checkpoint
    resumed = train(cfg, run_dir=tmp_path / "run", resume=True, quiet=True)
    assert resumed.train_losses == full.train_losses[2:]  # the buffer came back with the checkpoint
