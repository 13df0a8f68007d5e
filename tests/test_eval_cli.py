"""`speedgpt eval` end to end (in-process through speedgpt.cli.main) and its pieces."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from evalkit import make_run, tiny_config, write_corpus
from speedgpt.cli import main
from speedgpt.eval.run import EvalError, plan_batches, resolve_eval_files
from speedgpt.rundir.metrics import read_metrics

FIXTURE = Path(__file__).parent / "fixtures" / "hellaswag_mini.jsonl"


pytestmark = pytest.mark.usefixtures("one_thread")


def last_record(run: Path) -> dict:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])


def test_eval_reproduces_the_trainers_validation(tmp_path, capsys):
    from speedgpt.train.loop import train

    cfg = tiny_config(write_corpus(tmp_path / "data"), tmp_path / "run")
    result = train(cfg, quiet=True)
    assert main(["eval", str(tmp_path / "run")]) == 0
    rec = last_record(tmp_path / "run")
    assert rec["event"] == "eval" and rec["step"] == 2 and rec["tokens"] == 512
    assert rec["val_loss"] == pytest.approx(result.val_loss, rel=1e-6)  # same data, windows, batches
    assert rec["eval_tokens"] == cfg.data.val_tokens
    assert 0 < rec["val_bpb"] < 10 and "hellaswag_acc" not in rec
    out = capsys.readouterr().out
    assert "val loss" in out and f"{rec['val_loss']:.4f}" in out and "val bpb" in out
    # The report's reader takes the eval line as the step's eval record.
    evals = [r for r in read_metrics(tmp_path / "run") if "val_loss" in r]
    assert evals[-1]["event"] == "eval"


def test_eval_on_other_data_token_count_and_checkpoint(tmp_path, capsys):
    run = make_run(tmp_path, steps=(1, 2))
    other = write_corpus(tmp_path / "other", n_val=1500, seed=7)
    before = (run / "metrics.jsonl").read_text()
    assert main(["eval", str(run), "--data", str(other), "--tokens", "700", "--checkpoint", "1"]) == 0
    rec = last_record(run)
    assert rec["step"] == 1 and rec["checkpoint"] == "step_000001" and rec["tokens"] == 256
    assert rec["eval_tokens"] == 640  # whole rows of 64
    assert rec["eval_data"] == str(other)
    assert (run / "metrics.jsonl").read_text().startswith(before)  # appended, nothing rewritten
    # More than the shards hold: scores what there is, and says so.
    assert main(["eval", str(run), "--data", str(other), "--tokens", "100k", "--no-log"]) == 0
    assert "the val shards hold 1,500" in capsys.readouterr().out
    assert last_record(run)["eval_tokens"] == 640  # --no-log appended nothing
    # A different checkpoint of random weights gives a different loss: the named one was really loaded.
    assert main(["eval", str(run), "--data", str(other), "--tokens", "640", "--checkpoint", "2"]) == 0
    assert last_record(run)["val_loss"] != rec["val_loss"]


def test_eval_train_split_and_glob(tmp_path):
    run = make_run(tmp_path)
    assert main(["eval", str(run), "--split", "train", "--tokens", "1280"]) == 0
    train_loss = last_record(run)["val_loss"]
    data = tmp_path / "data"
    assert main(["eval", str(run), "--data", str(data / "train_*.bin"), "--tokens", "1280"]) == 0
    assert last_record(run)["val_loss"] == pytest.approx(train_loss)


def test_eval_hellaswag_from_a_file(tmp_path, capsys):
    run = make_run(tmp_path)
    assert main(["eval", str(run), "--tokens", "640", "--hellaswag", str(FIXTURE), "--limit", "3"]) == 0
    rec = last_record(run)
    assert rec["hellaswag_n"] == 3
    assert rec["hellaswag_acc"] in (0, 1 / 3, 2 / 3, 1) and rec["hellaswag_acc_sum"] in (0, 1 / 3, 2 / 3, 1)
    assert "hellaswag acc_norm" in capsys.readouterr().out


def test_eval_hellaswag_skips_examples_longer_than_the_context(tmp_path, capsys):
    # The fixture's rows are 26, 30, 25, 37 and 26 tokens (with BOS): a 32-token model scores 4 of them.
    run = make_run(tmp_path, extra=["--data.seq_len=32", "--data.val_tokens=640"])
    assert main(["eval", str(run), "--hellaswag", str(FIXTURE)]) == 0
    assert "skipped 1 HellaSwag example(s) longer than the 32-token context" in capsys.readouterr().out
    assert last_record(run)["hellaswag_n"] == 4


def test_eval_hellaswag_with_nothing_that_fits(tmp_path, capsys):
    run = make_run(tmp_path, extra=["--data.seq_len=16", "--data.val_tokens=640"])
    assert main(["eval", str(run), "--hellaswag", str(FIXTURE)]) == 2
    assert "fits the model's 16-token context" in capsys.readouterr().err


def test_eval_of_an_export_logs_nothing(tmp_path):
    run = make_run(tmp_path)
    assert main(["export", str(run), "--dtype", "fp32"]) == 0
    before = (run / "metrics.jsonl").read_text()
    assert main(["eval", str(run / "export"), "--tokens", "640"]) == 0
    assert (run / "metrics.jsonl").read_text() == before
    assert not (run / "export" / "metrics.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (["{tmp}/nope"], "does not exist"),
    (["{run}", "--checkpoint", "7"], "available steps: 2"),
    (["{run}", "--data", "{tmp}/nodata"], "no files match"),
    (["{run}", "--tokens", "10"], "less than one row"),
    (["{run}", "--hellaswag", "{tmp}/hs.jsonl"], "no such file"),
    (["{run}", "--hellaswag", "{tmp}"], "a folder, not a file"),  # it said "no such file" of a folder
])
def test_eval_errors_are_one_line(tmp_path, capsys, args, message):
    run = make_run(tmp_path)
    argv = ["eval"] + [a.format(tmp=tmp_path, run=run) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("speedgpt eval: ")


@pytest.mark.parametrize("flag", ["--chat-exact", "--chat-choice"])
def test_eval_chat_refuses_an_empty_task_file(tmp_path, capsys, flag):
    # Refused before the model is loaded (so a base run shows it too), and nothing is logged.
    run = make_run(tmp_path)
    before = (run / "metrics.jsonl").read_text()
    (tmp_path / "empty.jsonl").write_text("\n")
    assert main(["eval", str(run), "--chat", flag, str(tmp_path / "empty.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"speedgpt eval: {tmp_path / 'empty.jsonl'}: no examples") and err.count("\n") == 1
    assert (run / "metrics.jsonl").read_text() == before


def test_run_without_checkpoints_is_an_error(tmp_path, capsys):
    run = make_run(tmp_path, steps=())
    assert main(["eval", str(run)]) == 2
    assert "has no checkpoint" in capsys.readouterr().err


def test_default_corpus_matches_the_trainers(tmp_path, monkeypatch):
    """With no data.train_files the run used the local corpus; eval must find the same shards."""
    from speedgpt.parallel.dist import DistInfo
    from speedgpt.train.build import resolve_data_files

    def fake_build(out, max_tokens=None, piece_chars=0):  # stands in for the corpus builder: shards where it puts them
        write_corpus(Path(out))

    fake = types.ModuleType("speedgpt.data.tokenize")
    fake.ensure_local_python_corpus = fake_build
    monkeypatch.setitem(sys.modules, "speedgpt.data.tokenize", fake)
    cfg = tiny_config(tmp_path, tmp_path / "run", ["--data.train_files=", f"--data.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(EvalError, match="is gone"):
        resolve_eval_files(cfg, None, "val")
    train_files, val_files = resolve_data_files(cfg, DistInfo(), lambda msg: None)
    assert resolve_eval_files(cfg, None, "val") == val_files
    assert resolve_eval_files(cfg, None, "train") == train_files
    assert val_files[0].parent == cfg.data.default_corpus_dir()


@pytest.mark.parametrize("available, want, seq, max_rows, expect", [
    (10_000, 1024, 64, 8, (1024, 8)),     # 16 rows in batches of 8
    (10_000, 700, 64, 8, (640, 5)),       # 10 rows: batch 5 divides them
    (1_000, 4096, 64, 8, (960, 5)),       # the shards cap it: 15 rows (one token kept for the last target)
    (100_000, 64 * 13, 64, 8, (64 * 8, 8)),  # 13 rows (prime): drop 5 rather than batch 1
    (65, 4096, 64, 8, (64, 1)),
])
def test_plan_batches(available, want, seq, max_rows, expect):
    tokens, rows = plan_batches(available, want, seq, max_rows)
    assert (tokens, rows) == expect
    assert tokens % (rows * seq) == 0 and tokens + 1 <= available


def test_plan_batches_too_little_data():
    with pytest.raises(EvalError, match="cannot fill one row"):
        plan_batches(64, 1024, 64, 8)


def test_eval_loss_is_the_loss_of_the_windows_the_config_names(tmp_path):
    """The eval model uses the schedule's final windows (here short=16 < seq 64), not full attention."""
    from speedgpt.eval.run import evaluate_run
    from speedgpt.infer.load import load_model

    run = make_run(tmp_path)
    rec = evaluate_run(run, tokens=640, log=False, print_fn=lambda *a: None)
    model, cfg = load_model(run)
    assert model.windows == (64, 16)
    from speedgpt.data.val import val_batches

    losses = [model(x, y, reduction="none") for x, y in val_batches(
        resolve_eval_files(cfg, None, "val"), seq_len=64, batch_size=5, max_tokens=640)]
    assert rec["val_loss"] == pytest.approx(torch.cat(losses).double().mean().item(), rel=1e-6)
    full = [model(x, y, reduction="none", windows=(64, 64)) for x, y in val_batches(
        resolve_eval_files(cfg, None, "val"), seq_len=64, batch_size=5, max_tokens=640)]
    assert not math.isclose(rec["val_loss"], torch.cat(full).double().mean().item(), rel_tol=1e-6)


def test_eval_names_an_id_past_the_vocabulary(tmp_path, capsys):
    from speedgpt.data.shards import load_shard, write_shard

    run = make_run(tmp_path, steps=(1,))
    other = write_corpus(tmp_path / "other", seed=7)
    tokens = load_shard(other / "val_000000.bin").numpy().copy()
    tokens[9] = 50300  # inside the padded table (50304): scored silently without the check
    write_shard(other / "val_000000.bin", tokens)
    assert main(["eval", str(run), "--data", str(other), "--no-log"]) == 2
    err = capsys.readouterr().err.strip()
    assert "val_000000.bin has token id 50300 >= vocab_size 50257 (first at position 9" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
