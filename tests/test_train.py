import json
import math
import shutil

import pytest

from speedgpt.config import apply_overrides, load_toml
from speedgpt.rundir import with_run_dir
from speedgpt.rundir.checkpoint import CheckpointError, list_checkpoints, save_checkpoint
from speedgpt.train.loop import train


def test_short_run_learns_and_saves_its_config(tiny_cfg, tmp_path):
    result = train(tiny_cfg, run_dir=tmp_path / "run", quiet=True)
    losses = result.train_losses
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(50304), abs=0.05)
    assert sum(losses[-3:]) / 3 < losses[0] - 2.0
    assert result.val_loss < math.log(50304) - 2.0
    saved = load_toml(tmp_path / "run" / "config.toml")
    # the run dir's config reproduces the run; its run.dir names the directory (rundir.with_run_dir)
    assert saved == with_run_dir(tiny_cfg, tmp_path / "run") and saved.run.dir == str(tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {x["step"] for x in lines if "val_loss" in x} == {0, 6, 12}
    assert result.val_history[0][1] == pytest.approx(math.log(50304), abs=0.05)
    assert all({"train_loss", "lr", "tok_per_s", "step_ms", "tokens"} <= x.keys() for x in lines if "train_loss" in x)
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["torch"] and "packages" in env


def test_resume_equals_uninterrupted_run(small_vocab_cfg, tmp_path):
    cfg = apply_overrides(small_vocab_cfg, ["--train.checkpoint_every=6", "--train.keep_checkpoints=5"])
    full = train(cfg, run_dir=tmp_path / "run", quiet=True)
    ckpts = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in ckpts] == ["step_000006", "step_000012"]
    shutil.rmtree(ckpts[-1])  # as if the run had crashed after step 6's checkpoint
    resumed = train(cfg, run_dir=tmp_path / "run", resume=True, quiet=True)
    assert resumed.steps == 12
    assert resumed.train_losses == full.train_losses[6:]  # bitwise on CPU
    assert resumed.val_loss == full.val_loss


def test_resume_without_checkpoint_is_a_clear_error(tiny_cfg, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        train(tiny_cfg, run_dir=tmp_path / "empty", resume=True, quiet=True)


def test_corrupt_checkpoint_is_reported_and_left_intact(small_vocab_cfg, tmp_path):
    cfg = apply_overrides(small_vocab_cfg, ["--train.steps=4", "--train.val_every=0"])
    train(cfg, run_dir=tmp_path / "run", quiet=True)
    (ckpt,) = list_checkpoints(tmp_path / "run" / "checkpoints")
    model_file = ckpt / "model.pt"
    model_file.write_bytes(model_file.read_bytes()[:1000])  # truncated, as by a full disk
    before = sorted(p.name for p in ckpt.iterdir())
    longer = apply_overrides(cfg, ["--train.steps=6"])  # the run is complete: only a longer one loads the checkpoint
    with pytest.raises(CheckpointError, match=f"checkpoint file {ckpt / 'model.pt'} is truncated"):
        train(longer, run_dir=tmp_path / "run", resume=True, extend=True, quiet=True)
    assert sorted(p.name for p in ckpt.iterdir()) == before and model_file.stat().st_size == 1000


def test_checkpoint_write_is_atomic(tmp_path):
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, {"w": 1}, [], {"x": 1})
    (root / ".tmp-step_000002-123").mkdir()  # a crash mid-write leaves only a temp dir
    (root / ".tmp-step_000002-123" / "model.pt").write_bytes(b"partial")
    assert [p.name for p in list_checkpoints(root)] == ["step_000001"]
    for step in (2, 3, 4):
        save_checkpoint(root, step, {"w": step}, [], {}, keep=2)
    assert [p.name for p in list_checkpoints(root)] == ["step_000003", "step_000004"]


def test_time_budget_stops_early_with_final_eval(tiny_cfg, tmp_path):
    cfg = apply_overrides(tiny_cfg, ["--train.steps=1000", "--train.time_budget_s=0.001", "--train.val_every=0"])
    result = train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert result.steps == 1 and result.val_loss is not None
    assert list_checkpoints(tmp_path / "run" / "checkpoints")


def test_checkpoints_order_numerically(tmp_path):
    from speedgpt.rundir.checkpoint import latest_checkpoint

    for step in (999_999, 1_000_000):
        save_checkpoint(tmp_path, step, {}, [], {}, keep=5)
    assert latest_checkpoint(tmp_path).name == "step_1000000"


def test_cli_accepts_key_space_value_overrides(text_shards, tmp_path):
    from conftest import TINY_OVERRIDES
    from speedgpt.cli import main

    args = [o for o in TINY_OVERRIDES if not o.startswith("--train.steps")]
    rc = main(["train", "--preset", "tiny-cpu", *args, "--train.steps", "2", f"--data.train_files={text_shards}",
               "--run-dir", str(tmp_path / "run")])
    assert rc == 0
    assert load_toml(tmp_path / "run" / "config.toml").train.steps == 2


def test_cli_errors_are_one_line(tmp_path, capsys):
    from speedgpt.cli import main

    assert main(["train", "--train.log_every=0", "--train.device=cpu"]) == 2
    assert "train.log_every=0 must be at least 1" in capsys.readouterr().err
    rc = main(["train", "--data.train_files=/no/such/dir", "--train.device=cpu", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no files match /no/such/dir" in err
