"""Bad input never costs a run (issue 36): it is refused before the first training step, in one line
that names the file, key or value and the fix, and leaves nothing that blocks the corrected command."""

from __future__ import annotations

import pytest

from speedgpt.cli import main
from speedgpt.data.shards import load_shard, write_shard
from test_cli_errors import expect_one_line_error, train_argv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("bad_id", [60000, 50300])  # past the padded embedding (50304), and inside it
def test_a_val_shard_id_past_the_vocabulary_is_refused_at_start(bad_id, text_shards, tmp_path, capsys):
    tokens = load_shard(text_shards / "val_000000.bin").numpy().copy()
    tokens[100] = bad_id
    bad = tmp_path / "val" / "val_000000.bin"
    bad.parent.mkdir()
    write_shard(bad, tokens)
    run = tmp_path / "run"
    line = expect_one_line_error(train_argv(text_shards, run, f"--data.val_files={bad}"), capsys)
    assert f"{bad} has token id {bad_id} >= vocab_size 50257 (first at position 100" in line, line
    assert "re-tokenize" in line
    assert not (run / "config.toml").exists() and not (run / "metrics.jsonl").exists()  # no step, no run
