"""Crop's waste said aloud (issue 36 item 3): on a corpus of a few long documents, data.long_docs=crop
with a document cap keeps a few tokens a pass. The start line counts passes over what the crop keeps
and warns loudly naming the mode that keeps every token; a cap that leaves too few documents for a
row is one line and exit 2 before any step (not "does it hold BOS tokens?"); the loader's notice at
a new epoch no longer claims that every token was used."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TINY_OVERRIDES
from speedgpt.config import apply_overrides, load_preset
from speedgpt.data.coverage import read_coverage
from speedgpt.data.greedy import GreedyRows
from speedgpt.data.loader import TokenLoader
from speedgpt.data.shards import write_shard
from speedgpt.data.stream import EpochStreams, ShardCache
from speedgpt.planner import plan_run
from speedgpt.train.build import check_data_capacity, data_epoch_lines
from test_cli_errors import expect_one_line_error
from test_data_loader import BOS, make_corpus, random_lens

HUGE = [3000, 2500, 4000, 3500, 3000, 2800, 3200]  # seven long documents


@pytest.fixture
def huge_docs(tmp_path):
    make_corpus(tmp_path, HUGE[:4], [4], prefix="val")
    files, _ = make_corpus(tmp_path, HUGE, [3, 4], lead_in=5)  # a headless fragment: no document's
    return tmp_path, files


def crop_cfg(data, cap):
    return apply_overrides(load_preset("tiny-cpu"), TINY_OVERRIDES + [
        f"--data.train_files={data}", "--data.long_docs=crop", f"--train.stages=[{{share=1.0, max_doc_len={cap}}}]"])


def test_coverage_counts_what_a_cap_keeps(huge_docs, tmp_path):
    _, files = huge_docs
    cov = read_coverage(files, BOS)
    assert cov.total == sum(HUGE) + 5 and cov.lengths.tolist() == HUGE
    # a row of 65: 4 documents cut to 16 and 1 token of a fifth; the next row starts at the sixth
    assert cov.kept(16, 65) == 65 + 2 * 16 and cov.kept(0, 65) == cov.total
    assert cov.kept(5000, 7000) == 7000 + 7000 + 3200  # rows end inside the third and the sixth document
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    files, _ = make_corpus(mixed, random_lens(250, seed=5), [100, 150], lead_in=3)
    for cap, row_len in [(16, 65), (40, 65), (64, 65), (100, 256)]:
        assert read_coverage(files, BOS).kept(cap, row_len) == first_epoch_row_tokens(files, cap, row_len)


def first_epoch_row_tokens(files, cap, row_len):
    """The tokens of epoch 0 that the loader's crop rows hold, counted piece by piece."""
    rows, epoch, pos, kept = GreedyRows(EpochStreams(ShardCache(files, BOS), seed=0), "crop"), 0, 0, 0
    while epoch == 0:
        pieces, epoch, pos, _ = rows.row(epoch, pos, row_len, cap)
        kept += sum(end - start for e, start, end, _ in pieces if e == 0)
    return kept


def test_start_line_counts_passes_over_what_crop_keeps_and_warns(huge_docs):
    data, files = huge_docs
    plan = plan_run(crop_cfg(data, 16), 1)
    coverage = check_data_capacity(plan.cfg, plan, files)
    lines = data_epoch_lines(plan.cfg, plan, sum(HUGE) + 5, coverage=coverage)
    passes = 12 * 512 / 97  # 12 steps of 512 tokens, 97 tokens kept a pass
    assert f"keeps about 97 of them a pass: {passes:.2f} passes" in lines[0], lines
    assert "0.27 epochs" not in lines[0]  # the shards' size: what the line said before
    loud = [line for line in lines if "cuts 99.6% of the training tokens" in line]
    assert len(loud) == 1 and "7 of its 7 documents" in loud[0] and "--data.long_docs=mix (or split)" in loud[0]
    assert any("from about step 0 on" in line for line in lines)
    split = plan_run(apply_overrides(crop_cfg(data, 16), ["--data.long_docs=split"]), 1)
    assert check_data_capacity(split.cfg, split, files) is None  # nothing cropped: no pass over the data


def test_too_few_documents_for_a_row_is_one_line_before_training(huge_docs, tmp_path, capsys):
    data, _ = huge_docs
    run = tmp_path / "run"
    argv = ["train", "--run-dir", str(run)] + [a for a in TINY_OVERRIDES] + [
        f"--data.train_files={data}", "--data.long_docs=crop", "--train.stages=[{share=1.0, max_doc_len=8}]"]
    line = expect_one_line_error(argv, capsys)
    assert "train.stages[0].max_doc_len=8" in line and "too few documents for a row" in line, line
    assert "keeps 56 tokens a pass" in line and "seq_len+1=65" in line and "--data.long_docs=mix or split" in line
    assert not (run / "config.toml").exists()  # refused before the run was written


def test_loader_names_too_few_documents_or_no_bos(huge_docs, tmp_path):
    _, files = huge_docs
    loader = TokenLoader(files, seq_len=64, batch_size=1, prefetch=False, long_docs="crop")
    with pytest.raises(ValueError, match="too few documents for a row of 65 tokens when each is cut to 2"):
        loader.next_batch(max_doc_len=2)
    write_shard(tmp_path / "plain_000000.bin", np.arange(1, 500))
    plain = TokenLoader([tmp_path / "plain_000000.bin"], seq_len=64, batch_size=1, prefetch=False, long_docs="crop")
    with pytest.raises(ValueError, match="holds no BOS token"):
        plain.next_batch(max_doc_len=2)


def test_new_epoch_notice_says_what_was_cropped(huge_docs):
    _, files = huge_docs
    loader = TokenLoader(files, seq_len=64, batch_size=2, prefetch=False, long_docs="crop")
    with pytest.warns(UserWarning, match="starting epoch 2") as caught:
        for _ in range(3):  # 130 tokens a batch, 97 kept a pass
            loader.next_batch(max_doc_len=16)
    notice = str(caught[0].message)
    assert "were used once more" not in notice and "were cropped, never trained on" in notice, notice
    assert "data.long_docs=crop" in notice
