"""The run's plan (speedgpt/plan.py, planner.py): resolved once at the start of a run, printed, saved
as plan.json beside config.toml, and derivable again from that config alone."""

from __future__ import annotations

import json

import pytest

from speedgpt import planner
from speedgpt.config import ConfigError, apply_overrides, load_toml
from speedgpt.optim.schedules import attention_windows, lr_multiplier
from speedgpt.plan import RunPlan
from speedgpt.train.loop import train

# Two stages: the first with its own batch, rows and window, the second the run's own.
TABLE = ("--train.stages=[{share=0.5, batch_tokens=256, seq_len=32, window_long=32, lr_mul=2.0},"
         "{share=0.5}]")


def test_a_run_prints_and_saves_its_plan_resolved_once(tiny_cfg, tmp_path, monkeypatch, capsys):
    calls = []
    resolve = planner.resolve_budget
    monkeypatch.setattr(planner, "resolve_budget", lambda cfg: calls.append(1) or resolve(cfg))
    cfg = apply_overrides(tiny_cfg, [TABLE, "--train.steps=4", "--train.val_every=0",
                                     f"--run.dir={tmp_path / 'run'}"])
    train(cfg)
    assert len(calls) == 1  # the budget is entered once per run start
    saved = json.loads((tmp_path / "run" / "plan.json").read_text())
    # derived, never config: the saved config alone gives the same plan again
    plan = RunPlan.of(load_toml(tmp_path / "run" / "config.toml"))
    assert saved == json.loads(json.dumps(plan.as_dict()))
    stages = [(s["start"], s["end"], s["rows"], s["micro_steps"]) for s in saved["stages"]]
    assert stages == [(0, 2, 8, 1), (2, 4, 8, 1)]
    printed = capsys.readouterr().out
    assert all(line in printed for line in saved["printed"]) and saved["printed"][0] == "stages: 2 over 4 steps"


def test_the_plan_gives_each_step_its_stage_values(tiny_cfg):
    cfg = apply_overrides(tiny_cfg, [TABLE, "--train.steps=4"])
    plan = planner.plan_run(cfg, 1)
    assert plan.cfg.train.stages[1].batch_tokens == cfg.train.batch_tokens  # the table written concretely
    assert plan.windows_at(0) == (32, 16)  # the first stage's own window
    assert plan.windows_at(3) == attention_windows(cfg.schedule, 3, 4)  # the second follows the schedule
    assert plan.lr_mult_at(1) == lr_multiplier(cfg.schedule, 1, 4) * 2.0
    assert plan.lr_mult_at(3) == lr_multiplier(cfg.schedule, 3, 4)
    assert plan.window_changes()[0] == [0, 32, 16]


def test_a_batch_the_ranks_cannot_share_fails_when_planning(tiny_cfg):
    with pytest.raises(ConfigError, match="ranks"):
        planner.plan_run(apply_overrides(tiny_cfg, ["--train.batch_tokens=512"]), 3)
