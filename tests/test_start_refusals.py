"""Bad input never costs a run (issue 36): it is refused before the first training step, in one line
that names the file, key or value and the fix, and leaves nothing that blocks the corrected command."""

from __future__ import annotations

import json

import pytest
import torch

from speedgpt.cli import main
from speedgpt.data.shards import load_shard, write_shard
from speedgpt.rundir import RunDir
from speedgpt.rundir.reuse import RunDirInUse, prepare_new_run_dir, took_no_step
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


@pytest.mark.parametrize("extra, says", [
    (["--run.sample_tokens=-1"], "run.sample_tokens=-1 must be >= 0"),
    (["--run.sample_tokens=8", "--run.sample_prompt=" + " ".join(["word"] * 100)],
     "run.sample_prompt is 101 tokens (with BOS), which does not fit the model's context of 64; shorten it, or give "
     "--run.sample_tokens=0"),
    # (audit 29b) accepted, then the sample stopped at the context in silence after training (a long-context
    # preset's 262,144 tokens took that many decode steps)
    (["--run.sample_tokens=1e9"], "run.sample_tokens=1000000000 is more than the model's context of 64 tokens, where a "
                                  "sample stops; give at most 62 (the context less the prompt's 2 tokens with BOS)"),
])
def test_a_sample_that_cannot_be_printed_is_refused_at_start(extra, says, text_shards, tmp_path, capsys):
    # Both were found after the whole run had trained: a raw torch error, and "prompt of 102 tokens does not fit".
    run = tmp_path / "run"
    line = expect_one_line_error(train_argv(text_shards, run, *extra), capsys)
    assert says in line, line
    assert not (run / "config.toml").exists() and not (run / "metrics.jsonl").exists()  # no step, no run


def test_a_sample_cut_by_the_context_says_so(text_shards, tmp_path, capsys):
    # 64 new tokens (the default) fit these rows' context of 64, but not beside the prompt's 2 tokens: the run trains
    # (start refuses only a sample past the context), and its sample was cut at 62 without a word.
    assert main(train_argv(text_shards, tmp_path / "run", "--run.sample_tokens=64")) == 0
    captured = capsys.readouterr()
    assert ("speedgpt train: note: the model's context is 64 tokens, so a continuation stops after 62 new tokens, "
            "not run.sample_tokens=64") in captured.err, captured.err
    assert "sample:\n" in captured.out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_flex_attention_off_cuda_is_refused_at_start(text_shards, tmp_path, capsys, monkeypatch):
    """Was "FlexAttention does not support backward on CPU" at the first step, after the data was built and the
    first validation ran (a new-user audit). "auto" is sdpa there and trains."""
    from speedgpt.train import loop

    def no_build(*args, **kwargs):
        raise AssertionError("the data was read before the refusal")

    monkeypatch.setattr(loop, "resolve_data_files", no_build)
    run = tmp_path / "run"
    line = expect_one_line_error(train_argv(text_shards, run, "--model.attn_backend=flex"), capsys)
    assert "model.attn_backend=flex trains on a CUDA GPU only" in line and "--model.attn_backend=auto" in line, line
    assert not run.exists()


@pytest.mark.parametrize("where", ["the-file", "the-file/sub"])
def test_a_compile_cache_that_is_a_file_is_refused_at_start(where, text_shards, tmp_path, capsys):
    # Was "[Errno 20] Not a directory: '.../torch-2.13.0+cpu_...'" at the first compile, the run dir half written.
    (tmp_path / "the-file").write_text("not a folder")
    run = tmp_path / "run"
    line = expect_one_line_error(train_argv(text_shards, run, "--train.compile=true",
                                            f"--train.compile_cache={tmp_path / where}"), capsys)
    assert f"--train.compile_cache {tmp_path / where}" in line and "is a file" in line, line
    assert "pass a directory" in line and "off" in line
    assert not run.exists()


def test_a_sample_that_fails_after_training_leaves_the_report_written(text_shards, tmp_path, capsys, monkeypatch):
    from speedgpt.infer import generate

    def broken(*args, **kwargs):
        raise RuntimeError("the sample broke")

    monkeypatch.setattr(generate, "sample_text", broken)
    run = tmp_path / "run"
    line = expect_one_line_error(train_argv(text_shards, run, "--run.sample_tokens=8", "--run.report=true"), capsys)
    assert "the sample broke" in line
    assert (run / "report.html").exists() and (run / "report.png").exists()


def test_a_start_that_failed_before_its_first_step_does_not_block_the_retry(text_shards, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "val_000000.bin").write_bytes((text_shards / "val_000000.bin").read_bytes())
    good = load_shard(text_shards / "train_000000.bin").numpy().copy()
    bad = good.copy()
    bad[5] = 60000  # found when the first batch loads the shard: after the start wrote the run dir
    write_shard(data / "train_000000.bin", bad)
    run = tmp_path / "run"
    argv = train_argv(data, run)
    line = expect_one_line_error(argv, capsys)
    assert "has token id 60000" in line and (run / "config.toml").exists()
    (run / "notes.txt").write_text("mine")  # a file the run did not write
    write_shard(data / "train_000000.bin", good)  # the data fixed, the same command again
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"notice: {run} holds a start that recorded no training step" in err and "already holds" not in err
    assert any(r.get("step", 0) > 0 for r in RunDir(run).read_metrics()) and (run / "notes.txt").read_text() == "mine"


def write_start(run, metrics=(), **files):
    run.mkdir()
    (run / "config.toml").write_text("")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    for name, text in files.items():
        (run / name.replace("_", ".")).write_text(text)
    return run


@pytest.mark.parametrize("metrics, files, stepless", [
    ([{"step": 0, "event": "stages"}, {"step": 0, "val_loss": 10.8}], {}, True),
    ([{"step": 0, "val_loss": 10.8}, {"step": 4, "train_loss": 7.1}], {}, False),  # a logged step
    ([{"step": 0}], {"report_png": "x"}, False),  # a report: written after training
    ([], {"metrics_jsonl": '{"step": 0}\n{"step": 4, "tra'}, False),  # torn: not known to be stepless
])
def test_which_run_dirs_took_no_step(metrics, files, stepless, tmp_path):
    run = write_start(tmp_path / "run", metrics, **files)
    assert took_no_step(run) is stepless
    if stepless:
        (run / "checkpoints" / "step_000000").mkdir(parents=True)  # on_nonfinite=rollback's step-0 checkpoint
        assert not took_no_step(run)
        with pytest.raises(RunDirInUse, match="already holds a run"):
            prepare_new_run_dir(run, overwrite=False)


def test_overwrite_removes_every_file_a_run_wrote_and_keeps_the_users(tmp_path):
    """--overwrite replaces a run: its exports go too (an export-hf/ left behind held the old model, and `eval` on
    it scored that model under the new run's name); files the user put there stay."""
    from speedgpt.rundir.reuse import RUN_FILES

    run = write_start(tmp_path / "run", [{"step": 4, "train_loss": 7.1}])
    for name in ("export", "export-hf", "checkpoints"):
        (run / name).mkdir(exist_ok=True)
        (run / name / "model.safetensors").write_text("old")
    (run / "sft.json").write_text("{}")  # an SFT run's: left behind, it named the old run's base and data
    (run / "notes.md").write_text("mine")
    prepare_new_run_dir(run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.md"]
    assert "export-hf" in RUN_FILES


def test_val_tokens_below_one_row_names_val_tokens(text_shards):
    """--data.val_tokens=0 was blamed on the val shards ('hold 230 tokens, less than one row of 128')."""
    from speedgpt.config import DataConfig
    from speedgpt.data.shards import find_shards
    from speedgpt.train.validation import usable_val_tokens

    d = DataConfig(seq_len=128, val_tokens=0)
    with pytest.raises(ValueError, match=r"data.val_tokens=0 is less than one validation row of 128 tokens"):
        usable_val_tokens(d, find_shards(text_shards, "val"), print)
