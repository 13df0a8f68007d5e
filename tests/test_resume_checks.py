"""What `train --resume` checks before it continues a run (train/resume.py): weights that no longer
fit the edited config are named by the keys that changed, a finished run is left alone, a changed
step count needs --extend, and env.json keeps the run's first command."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import TINY_OVERRIDES
from speedgpt import faults
from speedgpt.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def train_argv(text_shards, run, *extra):
    return ["train", *TINY_OVERRIDES, "--train.val_every=0", f"--data.train_files={text_shards}", "--run-dir",
            str(run), *extra]


@pytest.fixture
def stopped_run(tmp_path, monkeypatch, capsys, text_shards):
    """A run of 6 steps stopped by SIGTERM after step 2 (checkpoint step_000002): one to resume."""
    run = tmp_path / "run"
    monkeypatch.setenv("SPEEDGPT_INJECT", "sigterm@1")
    faults.reset()
    monkeypatch.setattr(sys, "argv", ["speedgpt", "train", "--first-command"])
    assert main(train_argv(text_shards, run, "--train.steps=6")) != 0
    monkeypatch.delenv("SPEEDGPT_INJECT")
    faults.reset()
    assert (run / "checkpoints" / "step_000002").is_dir()
    capsys.readouterr()
    return run


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_resume_with_an_edited_model_names_what_changed_and_touches_nothing(stopped_run, capsys):
    run = stopped_run
    before = {name: (run / name).read_bytes() for name in ("config.toml", "metrics.jsonl", "env.json")}
    assert main(["train", "--resume", str(run), "--model.depth=3"]) == 2
    line = one_line(capsys)
    assert "checkpoint" in line and "does not fit the model" in line
    assert "(model.depth: checkpoint 2, config 3)" in line
    assert {name: (run / name).read_bytes() for name in before} == before  # the run is as it was

    # A checkpoint from before state.json kept the config, and config.toml edited by hand: the shapes.
    state_path = run / "checkpoints" / "step_000002" / "state.json"
    state = json.loads(state_path.read_text())
    del state["config"]
    state_path.write_text(json.dumps(state))
    (run / "config.toml").write_text((run / "config.toml").read_text().replace("depth = 2", "depth = 3"))
    assert main(["train", "--resume", str(run)]) == 2
    line = one_line(capsys)
    assert "does not fit the model" in line and "missing blocks.2." in line


def test_resume_appends_to_env_history_and_a_finished_run_is_left_alone(stopped_run, capsys, monkeypatch,
                                                                         text_shards):
    run = stopped_run
    monkeypatch.setattr(sys, "argv", ["speedgpt", "train", "--resume", str(run)])
    assert main(["train", "--resume", str(run)]) == 0
    env = json.loads((run / "env.json").read_text())
    assert env["argv"] == ["speedgpt", "train", "--first-command"]  # the command the run started with
    assert [(r["step"], r["argv"]) for r in env["resumes"]] == [(2, ["speedgpt", "train", "--resume", str(run)])]
    capsys.readouterr()

    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["train", "--resume", str(run)]) == 0
    out, err = capsys.readouterr()
    assert f"speedgpt train: {run} is complete (step 6 of 6); nothing to train" in out and "--extend" in out
    assert "resumed" not in out and err == ""
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files  # nothing rewritten
    # A scheduler re-running the run's own command with --auto-resume: the same answer.
    assert main(train_argv(text_shards, run, "--train.steps=6", "--auto-resume")) == 0
    assert f"{run} is complete (step 6 of 6)" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files


def test_resume_with_another_optimizer_value_needs_extend(stopped_run, capsys):
    """Another lr on resume changes the run from that step on, and config.toml would then say it for the steps before
    too: refused without --extend (it was accepted without a word), like a schedule change."""
    run = stopped_run
    before = (run / "config.toml").read_text()
    assert main(["train", "--resume", str(run), "--optim.muon_lr=0.01"]) == 2
    line = one_line(capsys)
    assert f"resuming {run} at step 2 with optim.muon_lr: checkpoint 0.05, config 0.01" in line
    assert "muon lr at step 2 from 0.05 to 0.01" in line and "add --extend" in line
    assert (run / "config.toml").read_text() == before


def test_resume_with_another_training_value_needs_extend_and_env_names_it(stopped_run, capsys):
    """Another softcap, seed or batch on resume trained differently from that step on, and config.toml then said it
    held from step 0 (a new-user audit: accepted without a word; a seed only failed in the loader's state)."""
    run = stopped_run
    before = {name: (run / name).read_bytes() for name in ("config.toml", "metrics.jsonl", "env.json")}
    assert main(["train", "--resume", str(run), "--model.logit_softcap=30", "--data.seq_len=32"]) == 2
    line = one_line(capsys)
    assert f"resuming {run} at step 2 with model.logit_softcap: checkpoint 0.0, config 30.0; data.seq_len: " \
        "checkpoint 64, config 32 would train differently" in line and "add --extend" in line
    # the seed and the loader's switches: its saved position holds for the run's own, so --extend cannot take them
    # (it passed them to the loader, which refused after the model was built)
    for extend in ([], ["--extend"]):
        assert main(["train", "--resume", str(run), "--train.seed=7", "--data.long_docs=crop", *extend]) == 2
        line = one_line(capsys)
        assert f"resuming {run} at step 2 with data.long_docs: checkpoint 'split', config 'crop'; train.seed: " \
            "checkpoint 1337, config 7: the run's data order" in line and "resume with the run's own values" in line
    assert {name: (run / name).read_bytes() for name in before} == before  # the run is as it was
    # a cadence is not the training's: accepted as it was
    assert main(["train", "--resume", str(run), "--train.val_every=3", "--model.logit_softcap=30", "--extend"]) == 0
    env = json.loads((run / "env.json").read_text())
    assert env["resumes"][-1]["changed"] == ["model.logit_softcap: checkpoint 0.0, config 30.0"]


def test_training_changes_leave_out_what_a_resume_may_change():
    """The planner fits a stage table's rows (data.seq_len among them) to the world size, so a resume on another
    number of ranks may plan other rows: not a change of the user's. Without a table the rows are the user's."""
    import dataclasses

    from speedgpt.config import Config, StageConfig
    from speedgpt.train.resume import training_changes

    base = Config()
    moved = dataclasses.replace(base, data=dataclasses.replace(base.data, seq_len=512, train_files="elsewhere"),
                                train=dataclasses.replace(base.train, val_every=5, compile=True))
    assert training_changes(base.to_dict(), moved) == ["data.seq_len: checkpoint 1024, config 512"]
    table = [StageConfig(share=1.0)]
    with_table = dataclasses.replace(base, train=dataclasses.replace(base.train, stages=table))
    assert training_changes(with_table.to_dict(), dataclasses.replace(
        moved, train=dataclasses.replace(moved.train, stages=table))) == []
    softer = dataclasses.replace(base, model=dataclasses.replace(base.model, logit_softcap=30.0))
    assert training_changes(base.to_dict(), softer) == ["model.logit_softcap: checkpoint 15.0, config 30.0"]
    deeper = dataclasses.replace(base, model=dataclasses.replace(base.model, depth=3, logit_softcap=30.0))
    assert training_changes(base.to_dict(), deeper) == []  # another shape: the weights' load names it


def test_resume_with_more_steps_needs_extend(stopped_run, capsys):
    run = stopped_run
    assert main(["train", "--resume", str(run), "--train.steps=3"]) == 2
    line = one_line(capsys)
    assert f"resuming {run} at step 2 with train.steps: checkpoint 6, config 3 would change its schedules" in line
    assert "muon lr at step 2 from 0.05 to 0.0383" in line and "add --extend" in line  # into the cooldown at once
    assert main(["train", "--resume", str(run), "--train.steps=3", "--extend"]) == 0
    logged = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if "train_loss" in r and r["step"] > 2]  # (step 2, the stopped one, is logged before the stop)
    assert [(r["step"], round(r["lr"], 4)) for r in logged] == [(3, 0.0383)]  # step 2's lr, as announced
    # Shorter than its checkpoint: it said "complete (step 3 of 2)" and exited 0, the steps asked for not taken
    assert main(["train", "--resume", str(run), "--train.steps=2", "--extend"]) == 2
    line = one_line(capsys)
    assert "its checkpoint is at step 3 already" in line and "give --train.steps > 3" in line


def test_a_finished_budget_run_extends_to_the_step_count_given(tmp_path, small_vocab_cfg):
    """A budget run's config keeps its budget: `--resume RUN --train.steps=N --extend` must train to N, not
    derive the run's own step count from the budget again (and call the run complete)."""
    from speedgpt.budget import scaling_params
    from speedgpt.config import apply_overrides, load_toml, resolve
    from speedgpt.planner import plan_run
    from speedgpt.train.loop import train

    run = tmp_path / "run"
    ratio = 2 * 512 / scaling_params(small_vocab_cfg.model)  # two steps of the 512-token batch
    budget_run = apply_overrides(small_vocab_cfg, ["--train.val_every=0", f"--train.tokens_per_param={ratio!r}"])
    assert train(budget_run, run_dir=run, quiet=True).steps == 2
    # what `speedgpt train --resume RUN --train.steps=4 --extend` does with the run's config.toml
    extended = resolve(None, str(run / "config.toml"), ["--train.steps=4"])
    assert train(extended, run_dir=run, resume=True, extend=True, quiet=True).steps == 4
    saved = load_toml(run / "config.toml")
    assert (saved.train.steps, saved.train.horizon, saved.train.batch_tokens) == (4, "steps", 512)
    assert plan_run(saved).cfg.train.steps == 4  # the saved config reproduces the extended run


def test_a_relative_data_path_resumed_from_elsewhere_names_the_start_directory(tmp_path, monkeypatch, capsys,
                                                                                text_shards):
    """config.toml keeps --data.train_files as typed: a resume from another directory said only "no files match"."""
    run = tmp_path / "run"
    monkeypatch.chdir(text_shards.parent)
    monkeypatch.setenv("SPEEDGPT_INJECT", "sigterm@1")
    faults.reset()
    argv = train_argv(text_shards, run, "--train.steps=6", f"--data.train_files={text_shards.name}")
    assert main(argv) != 0
    monkeypatch.delenv("SPEEDGPT_INJECT")
    faults.reset()
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(run)]) == 2
    err = one_line(capsys)
    assert f"({text_shards.name} is relative to the directory the run was started from, {text_shards.parent}: run " \
        f"from there, or give the path as an absolute one)" in err, err
