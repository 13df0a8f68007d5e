"""`speedgpt sweep`: the frontier analysis on constructed numbers, and a tiny grid end to end."""

from __future__ import annotations

import json
import math

import pytest

from conftest import CONFIG_DAMAGE, TINY_OVERRIDES, damage_run_config
from speedgpt.sweep import RunResult, frontier, optimal_params, power_law


def run(name, depth, budget, params, loss, kind="flops_budget"):
    return RunResult(name, kind, depth, budget, params, 512, 10, 5120, budget, loss, 1.0)


def test_power_law_recovers_its_exponent():
    xs = [1e12, 1e13, 1e14, 1e15]
    fit = power_law(xs, [3.0 * x ** 0.5 for x in xs])
    assert fit["a"] == pytest.approx(0.5) and fit["k"] == pytest.approx(3.0) and fit["r2"] == pytest.approx(1.0)
    assert power_law([1e12, 1e12], [1.0, 2.0]) is None


def test_frontier_finds_the_parabola_vertex_per_budget():
    # Per budget C, loss = 3 + (ln N - ln N*(C))^2 / 10 with N*(C) = 0.01 x C^0.5: the vertex of the
    # parabola through three depths is N* exactly, and N* over budgets fits C^0.5.
    results = []
    for c in (1e14, 1e15, 1e16):
        n_opt = 0.01 * c ** 0.5
        for depth, n in ((2, n_opt / 3), (4, n_opt * 1.5), (6, n_opt * 5)):
            results.append(run(f"d{depth}-c{c:g}", depth, c, int(n), 3 + (math.log(int(n)) - math.log(n_opt)) ** 2 / 10))
    front = frontier(results)
    assert [row["best"] for row in front["rows"]] == ["d4-c1e+14", "d4-c1e+15", "d4-c1e+16"]
    for row in front["rows"]:
        assert row["params_opt"] == pytest.approx(0.01 * row["flops"] ** 0.5, rel=1e-3)
    assert front["params_fit"]["a"] == pytest.approx(0.5, abs=1e-3)
    # two depths cannot place a vertex: the better run's size is taken
    assert optimal_params(results[:2]) == results[1].params


def test_tokens_per_param_frontier_is_the_lower_envelope():
    results = [run("a", 2, 10, 100, 5.0, "tokens_per_param"), run("b", 4, 10, 200, 4.0, "tokens_per_param"),
               run("c", 2, 20, 100, 4.5, "tokens_per_param")]
    results[0].flops, results[1].flops, results[2].flops = 1e12, 4e12, 2e12
    rows = frontier(results)["rows"]
    assert [r["best"] for r in rows] == ["a", "c", "b"]


def test_sweep_end_to_end_and_resumable(tmp_path, text_shards, capsys):
    from speedgpt.sweep import main

    skip = ("--model.depth", "--model.model_dim", "--train.steps", "--train.val_every")
    overrides = [o for o in TINY_OVERRIDES if not o.startswith(skip)] + [
        f"--data.train_files={text_shards}", "--model.aspect_ratio=32", "--train.val_every=0"]
    out = tmp_path / "sweep"
    overrides += ["--train.batch_tokens=128", "--data.val_tokens=512"]  # the 50K-row head dominates a step
    args = ["--out", str(out), "--depths", "2,3", "--flops", "8e9,1.6e10", "--preset", "tiny-cpu", *overrides]
    assert main(args) == 0
    names = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert names == ["d2-c1.6e10", "d2-c8e9", "d3-c1.6e10", "d3-c8e9"]
    data = json.loads((out / "results.json").read_text())
    assert len(data["runs"]) == 4 and all(math.isfinite(r["val_loss"]) for r in data["runs"])
    for r in data["runs"]:  # each run spent its budget, within one step
        assert abs(r["flops"] - r["budget"]) <= r["flops"] / r["steps"]
    assert len(data["frontier"]["rows"]) == 2 and data["frontier"]["params_fit"] is not None
    md = (out / "sweep.md").read_text()
    assert md.count("| d2-") + md.count("| d3-") == 4 + 2 and "N_opt =" in md
    assert (out / "frontier.png").stat().st_size > 0 and (out / "optimal_params.png").stat().st_size > 0
    before = {n: (out / n / "metrics.jsonl").read_text() for n in names}
    capsys.readouterr()
    assert main(args) == 0  # everything finished: nothing is trained again
    assert capsys.readouterr().out.count("finished earlier, skipped") == 4
    assert json.loads((out / "sweep.json").read_text()) == {"preset": "tiny-cpu", "overrides": overrides}
    assert main(["--out", str(out), "--analyze"]) == 0  # its runs match the recorded settings
    assert "not checked" not in capsys.readouterr().err
    assert before == {n: (out / n / "metrics.jsonl").read_text() for n in names}
    # other settings into the same directory: refused before any run, not the old runs reported as theirs
    assert main([*args, "--optim.muon_lr=0.5"]) == 2
    err = capsys.readouterr().err
    assert "holds a run of other settings (differs in optim.muon_lr)" in err and "use a new --out" in err
    assert before == {n: (out / n / "metrics.jsonl").read_text() for n in names}


def test_sweep_errors_name_the_fix(tmp_path, capsys):
    from speedgpt.sweep import main

    assert main(["--out", str(tmp_path), "--analyze"]) == 2
    assert "no finished run" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--depths", "2,x", "--flops", "1e12"]) == 2
    assert "--depths '2,x': give comma-separated numbers" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--depths", "2,3,2", "--flops", "1e12"]) == 2  # one directory, two runs
    assert "--depths '2,3,2' names 2 twice; give each value once" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # the sweep sets the depth per run: this one would be overridden
        main(["--out", str(tmp_path), "--depths", "2", "--flops", "1e12", "--model.depth=5"])
    assert e.value.code == 2 and "--model.depth=5: the sweep sets model.depth" in capsys.readouterr().err
    assert main(["--out", str(tmp_path), "--depths", "2", "--flops", "1e12", "--preset", "tiny-cpu",
                 "--model.value_embeds=3"]) == 2
    assert "model.value_embeds=3 needs depth >= 6" in capsys.readouterr().err
    for data, message in ((tmp_path / "none", "no files match"), (tmp_path, "has no train shards")):
        assert main(["--out", str(tmp_path / "s"), "--depths", "2", "--flops", "1e12", "--preset", "tiny-cpu",
                     f"--data.train_files={data}"]) == 2
        assert message in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_ended_by_reads_steps_time_budget_or_unfinished():
    from speedgpt.rundir.metrics import ended_by

    val = lambda step, **k: {"step": step, "tokens": step, "time_s": 1.0, "val_loss": 3.0, **k}  # noqa: E731
    budget = {"step": 4, "tokens": 4, "time_s": 1.0, "event": "time_budget", "budget_s": 1.0}
    assert ended_by([val(0), val(10)], 10) == "steps"
    assert ended_by([val(0), budget, val(4)], 10) == "time budget"
    assert ended_by([val(0), val(4)], 10) is None  # a crash after an evaluation: not finished
    assert ended_by([val(0), budget], 10) is None  # stopped, but its final validation never came
    assert ended_by([val(0), budget, val(4), {"step": 6, "train_loss": 2.0}], 10) is None  # resumed past it
    assert ended_by([val(0), val(10, event="eval")], 10) is None  # `speedgpt eval` later: not training's


def test_a_run_stopped_by_its_time_budget_is_finished(tmp_path, tiny_cfg, capsys):
    """train.time_budget_s=1e-9 stops after the first step, whatever the machine's speed."""
    from speedgpt.config import apply_overrides
    from speedgpt.sweep import Point, collect, finished, run_point
    from speedgpt.train.loop import train

    out = tmp_path / "sweep"
    point = Point(2, 8e9, "d2-c8e9")
    cfg = apply_overrides(tiny_cfg, ["--train.time_budget_s=1e-9"])
    train(cfg, run_dir=out / point.name, quiet=True)
    assert finished(out / point.name) == "time budget"
    assert run_point(out, point, "flops_budget", "tiny-cpu", []) is True  # not trained again
    assert "finished earlier (stopped by its time budget), skipped" in capsys.readouterr().out
    (result,) = collect(out)
    assert (result.ended_by, result.steps) == ("time budget", 1)


def test_a_sweep_point_below_one_step_is_refused_before_any_run(tmp_path, capsys):
    from speedgpt.sweep import main

    assert main(["--out", str(tmp_path / "s"), "--depths", "4", "--flops", "1e3", "--preset", "tiny-cpu"]) == 2
    err = capsys.readouterr().err
    assert "--flops 1000 is less than one training step at depth 4 (d4-c1e3)" in err
    assert "the smallest --flops for depth 4 is" in err and not (tmp_path / "s").exists()
    assert main(["--out", str(tmp_path / "s"), "--depths", "4", "--flops", "0"]) == 2
    assert "give positive numbers, e.g. --flops 1e15,3e15" in capsys.readouterr().err


def test_on_a_gpu_a_sweep_without_a_preset_plans_a_depth_ladder(tmp_path, capsys, monkeypatch):
    """train's GPU default (speedrun-latest) names layers of a 12-layer model, so it cannot be a depth ladder's
    base: the sweep keeps its own GPU default, whose switches hold at every depth."""
    import torch

    from speedgpt.sweep import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["--out", str(tmp_path / "s"), "--depths", "8,12", "--flops", "1e17", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "d8-c1e17" in out and "d12-c1e17" in out


def test_a_finished_run_of_other_settings_in_out_is_refused_not_put_on_the_frontier(tmp_path, text_shards, capsys):
    """The analysis reads every finished run in --out: an earlier sweep's run of other settings at another grid point
    (not one this command plans, so check_existing never saw it) went into the new sweep's frontier, exit 0."""
    from speedgpt.config import resolve
    from speedgpt.planner import plan_run
    from speedgpt.rundir import RunDir
    from speedgpt.sweep import Point, main, point_overrides

    skip = ("--model.depth", "--model.model_dim", "--train.steps", "--train.val_every")
    base = [o for o in TINY_OVERRIDES if not o.startswith(skip)] + [
        f"--data.train_files={text_shards}", "--model.aspect_ratio=32", "--train.val_every=0",
        "--train.batch_tokens=128"]
    out = tmp_path / "sweep"
    old = Point(2, 8e9, "d2-c8e9")  # finished earlier with --optim.muon_lr=0.5
    cfg = plan_run(resolve("tiny-cpu", None, point_overrides(old, "flops_budget", [*base, "--optim.muon_lr=0.5"]))).cfg
    run = RunDir(out / old.name)
    run.root.mkdir(parents=True)
    run.write_config(cfg)
    final = {"step": cfg.train.steps, "tokens": 1, "time_s": 1.0, "val_loss": 3.0}
    run.metrics_path.write_text(json.dumps(final) + "\n")
    args = ["--out", str(out), "--depths", "3", "--flops", "8e9", "--preset", "tiny-cpu", "--dry-run"]
    assert main([*args, *base]) == 2
    refused = capsys.readouterr()
    err = refused.err
    assert f"{out / old.name} is a finished run of other settings (differs in optim.muon_lr)" in err
    assert "d3-c8e9" not in refused.out  # a refused --out prints no plan as if the sweep would run
    assert "use a new --out" in err
    assert main([*args, *base, "--optim.muon_lr=0.5"]) == 0  # the same settings at a new depth: welcome
    assert "sweep: d3-c8e9: " in capsys.readouterr().out

    # --analyze alone checks the runs against the settings the last sweep recorded (it knew no preset before)
    settings = out / "sweep.json"
    settings.write_text(json.dumps({"preset": "tiny-cpu", "overrides": base}))
    assert main(["--out", str(out), "--analyze"]) == 2
    err = capsys.readouterr().err
    assert f"{out / old.name} is a finished run of other settings (differs in optim.muon_lr)" in err
    assert f"or delete {settings} to analyze without this check" in err  # not "use a new --out", no way out here
    settings.write_text(json.dumps({"preset": "tiny-cpu", "overrides": [*base, "--optim.muon_lr=0.5"]}))
    assert main(["--out", str(out), "--analyze"]) == 0
    settings.write_text("[1, 2]")
    assert main(["--out", str(out), "--analyze"]) == 2
    assert "is not a sweep's settings file" in capsys.readouterr().err
    settings.unlink()  # a sweep directory from before the file: analyzed, with a note that nothing was checked
    assert main(["--out", str(out), "--analyze"]) == 0
    assert "holds no sweep.json" in capsys.readouterr().err



@pytest.mark.parametrize("how", CONFIG_DAMAGE)
def test_a_finished_run_whose_config_is_unreadable_is_refused_before_the_plan(tmp_path, capsys, how):
    """(audit 29b) A run in --out whose config.toml was emptied, cut short, made invalid TOML or removed was taken
    for no run by the settings check: a planned point was refused only once it was reached (after the plan was
    printed), invalid TOML named no fix, and `--analyze` left a run without its config.toml off the frontier."""
    from speedgpt.config import resolve
    from speedgpt.planner import plan_run
    from speedgpt.rundir import RunDir
    from speedgpt.sweep import Point, main, point_overrides

    out = tmp_path / "sweep"
    point = Point(2, 1e11, "d2-c1e11")
    cfg = plan_run(resolve("tiny-cpu", None, point_overrides(point, "flops_budget", []))).cfg
    run = RunDir(out / point.name)
    run.root.mkdir(parents=True)
    run.write_config(cfg)
    run.metrics_path.write_text(json.dumps({"step": cfg.train.steps, "tokens": 1, "time_s": 1.0, "val_loss": 3.0})
                                + "\n")
    (out / "sweep.json").write_text(json.dumps({"preset": "tiny-cpu", "overrides": []}))
    damage_run_config(run.root, how)
    for argv in (["--depths", "2", "--flops", "1e11", "--preset", "tiny-cpu", "--dry-run"], ["--analyze"]):
        assert main(["--out", str(out), *argv]) == 2
        captured = capsys.readouterr()
        line = captured.err.strip()
        assert "\n" not in line and str(run.root) in line and "restore it" in line, (argv, line)
        assert f"delete {run.root}" in line and "d2-c1e11: " not in captured.out


def test_a_run_that_exits_0_without_its_final_validation_fails_loudly(tmp_path, capsys, monkeypatch):
    """A run whose checkpoint is at its last step but whose metrics lack the final validation (stopped in its last
    step): its resume says "complete, nothing to train" and exits 0; the sweep counted it done, the analysis left it
    out, and the sweep exited 0 with one point fewer on its frontier."""
    import subprocess
    import types

    from speedgpt.config import load_preset
    from speedgpt.rundir import RunDir
    from speedgpt.sweep import Point, run_point

    out = tmp_path / "sweep"
    point = Point(2, 8e9, "d2-c8e9")
    run = RunDir(out / point.name)
    (run.checkpoints / "step_000012").mkdir(parents=True)
    run.write_config(load_preset("tiny-cpu"))
    run.metrics_path.write_text(json.dumps({"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 9.0}) + "\n")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: calls.append(cmd) or types.SimpleNamespace(returncode=0))
    assert run_point(out, point, "flops_budget", "tiny-cpu", []) is False
    assert "--resume" in calls[0]
    out_text = capsys.readouterr().out
    assert "d2-c8e9: failed: its train exited 0 but its metrics hold no final validation" in out_text
    assert f"delete {out / point.name}" in out_text
