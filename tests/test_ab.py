"""`speedgpt ab`: statistics against a hand-checked case, the launch plan on fake devices, and a
tiny end-to-end A/B on CPU that is interrupted and resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import CONFIG_DAMAGE, TINY_OVERRIDES, damage_run_config
from speedgpt.ab.cli import main
from speedgpt.ab.plan import make_plan, waves
from speedgpt.ab.stats import detectable_difference, paired
from speedgpt.ab.summary import summarize, verdict


def test_paired_statistics_by_hand():
    # a = 3.0, 3.1, 3.2 and b = 2.9, 3.05, 3.1: differences d = -0.10, -0.05, -0.10.
    # mean d = -0.25 / 3 = -0.083333; deviations -0.016667, +0.033333, -0.016667;
    # sd = sqrt((0.00027778 + 0.0011111 + 0.00027778) / 2) = sqrt(0.00083333) = 0.028868;
    # se = sd / sqrt(3) = 0.016667; t = mean / se = -5.0 with 2 degrees of freedom.
    # 95 % CI: t_{0.975, 2} = 4.302653, half-width 4.302653 * 0.016667 = 0.071711 -> [-0.155044, -0.011622].
    # One-sided p = P(T_2 <= -5); T_2's CDF is 1/2 + t / (2 sqrt(t^2 + 2)): 0.5 - 5 / (2 sqrt 27) = 0.018875.
    res = paired([3.0, 3.1, 3.2], [2.9, 3.05, 3.1])
    assert res["n"] == 3 and res["mean_diff"] == pytest.approx(-0.083333, abs=1e-6)
    assert res["sd_diff"] == pytest.approx(0.028868, abs=1e-6)
    assert res["t"] == pytest.approx(-5.0, abs=1e-9)
    assert res["ci95"] == pytest.approx([-0.155044, -0.011622], abs=1e-6)
    assert res["p_b_better"] == pytest.approx(0.018875, abs=1e-6)
    # B worse: the same test gives 1 - p.
    assert paired([2.9, 3.05, 3.1], [3.0, 3.1, 3.2])["p_b_better"] == pytest.approx(1 - 0.018875, abs=1e-6)
    # resolution: t_{0.95, 2} = 2.919986, so 3 pairs with sd 0.028868 resolve 2.919986 * 0.016667 = 0.048666
    assert detectable_difference(0.028868, 3) == pytest.approx(0.048666, abs=1e-5)


def test_paired_statistics_edge_cases():
    assert paired([1.0], [2.0])["p_b_better"] is None  # one pair: no test, said so
    same = paired([1.0, 2.0], [1.5, 2.5])  # every difference 0.5: no spread
    assert same["p_b_better"] is None and "same difference" in same["note"]


def plan_for(tmp_path, seeds=2):
    return make_plan(preset="tiny-cpu", common=[], a="--optim.muon_lr=0.04", b="", seeds=seeds, out=tmp_path)


def test_waves_pair_a_and_b_of_a_seed_and_swap_gpus(tmp_path):
    plan = plan_for(tmp_path, seeds=3)
    assert [(r.arm, r.seed) for r in plan.runs] == [("a", 1337), ("b", 1337), ("a", 1338), ("b", 1338),
                                                    ("a", 1339), ("b", 1339)]
    two = [[(r.arm, r.seed, d) for r, d in w] for w in waves(plan.runs, ["0", "1"])]
    assert two == [[("a", 1337, "0"), ("b", 1337, "1")], [("a", 1338, "1"), ("b", 1338, "0")],
                   [("a", 1339, "0"), ("b", 1339, "1")]]
    one = [[(r.arm, d) for r, d in w] for w in waves(plan.runs, ["0"])]
    assert one == [[("a", "0")], [("b", "0")]] * 3  # one GPU: A B A B, one at a time
    shared = [[d for _, d in w] for w in waves(plan.runs, ["0"], concurrent=2)]
    assert shared == [["0", "0"]] * 3
    for r in plan.runs:  # paired: same seed, own directory
        assert f"--train.seed={r.seed}" in r.argv and r.run_dir == tmp_path / f"{r.arm}-seed{r.seed}"


@pytest.mark.parametrize("kwargs, message", [
    (dict(a="--optim.nosuch=1", b=""), "unknown config key 'optim.nosuch'"),
    (dict(a="", b=""), "same configuration"),
    (dict(a="--run.sample_tokens=0", b="--run.wandb=true"), "same configuration"),  # logging only: an A/A test
    (dict(a="--optim.muon_lr=0.04", b="", seeds=1), "at least 2 seeds"),
    (dict(a="--train.seed=3", b=""), "sets train.seed"),
    (dict(a="oops", b=""), "is not a config override"),
    (dict(a="--optim.muon_lr=0.04", b="", target="abc"), "--target-loss 'abc'"),  # before any run trains
    (dict(a="--optim.muon_lr=0.04", b="", target="-3"), "--target-loss '-3': a validation loss is > 0"),
    (dict(a="--optim.muon_lr=0.04", b="", target="nan"), "--target-loss 'nan': a validation loss is > 0"),
    (dict(a="--optim.muon_lr=0.04 --data.train_files=/nonexistent/shards", b=""), "no files match /nonexistent"),
])
def test_bad_input_is_one_line(tmp_path, capsys, kwargs, message):
    argv = ["--preset", "tiny-cpu", "--a", kwargs["a"], "--b", kwargs["b"], "--seeds", str(kwargs.get("seeds", 2)),
            "--out", str(tmp_path / "ab"), "--dry-run"] + (["--target-loss", kwargs["target"]] if "target" in kwargs else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("extra, message", [
    (["--concurrent", "2", "--step-ms", "A=nan,B=-1"], "a step takes a finite time > 0 ms"),  # nan times to target
    (["--concurrent", "2", "--step-ms", "A=800,B=0"], "a step takes a finite time > 0 ms"),
    (["--concurrent", "2", "--step-ms", "A=800"], "give both arms"),  # B's times to target all missing
    (["--step-ms", "A=800,B=700"], "with --concurrent 1 each run's own training time is measured"),  # was ignored
])
def test_step_ms_that_would_fake_or_be_ignored_is_refused(tmp_path, capsys, extra, message):
    """A new-user audit: --step-ms A=nan,B=-1 was taken (times to target of nan and below zero), and --step-ms without
    --concurrent > 1 was silently ignored."""
    argv = ["--preset", "tiny-cpu", "--a", "--optim.muon_lr=0.04", "--b", "", "--out", str(tmp_path / "ab"),
            "--dry-run", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_same_arms_are_allowed_as_an_a_a_test(tmp_path, capsys):
    assert main(["--preset", "tiny-cpu", "--a", "", "--b", "", "--allow-same", "--seeds", "2", "--dry-run",
                 "--out", str(tmp_path)]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 4


def logs(out: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in sorted(out.glob("*/train.log"))}


@pytest.mark.usefixtures("one_thread")
def test_ab_end_to_end_resumes_without_retraining(text_shards, tmp_path, capsys):
    out = tmp_path / "ab"
    tiny = [o for o in TINY_OVERRIDES if not o.startswith(("--train.steps", "--train.val_every", "--train.log_every",
                                                           "--data.val_tokens"))] + ["--data.val_tokens=512"]
    argv = ["--preset", "tiny-cpu", *tiny, f"--data.train_files={text_shards}", "--steps", "2",
            "--train.val_every=1", "--train.log_every=1", "--a", "--optim.muon_lr=0.02", "--b", "", "--seeds", "2",
            "--target-loss", "10.5", "--devices", "cpu", "--no-checkpoint", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    for arm in ("a", "b"):
        finals = summary["arms"][arm]["final_loss"]
        assert set(finals["per_seed"]) == {"1337", "1338"} and finals["n"] == 2 and finals["std"] is not None
        run = summary["arms"][arm]["runs"][0]
        assert [c["step"] for c in run["curve"]] == [0, 1, 2] and run["steps"] == 2 and run["tokens"] == 1024
        assert run["time_to_target_s"] is None or run["time_to_target_s"] <= run["train_time_s"]
    p = summary["paired"]["final_loss"]
    assert p["n"] == 2 and len(p["ci95"]) == 2 and 0 <= p["p_b_better"] <= 1
    assert p["mean_diff"] == pytest.approx(summary["arms"]["b"]["final_loss"]["mean"]
                                           - summary["arms"]["a"]["final_loss"]["mean"])
    assert summary["failures"] == [] and (out / "ab.png").stat().st_size > 0
    assert (out / "notebook_row.md").read_text().count("|") > 20
    first = logs(out)
    assert len(first) == 4

    capsys.readouterr()
    assert main(argv) == 0  # everything finished: nothing is trained again
    assert logs(out) == first and "ab: A seed" not in capsys.readouterr().out

    assert not (out / "a-seed1337" / "checkpoints").exists()  # --no-checkpoint
    # B seed 1338 interrupted before its final validation (no checkpoint): only it is rerun, from scratch.
    victim = out / "b-seed1338"
    lines = (victim / "metrics.jsonl").read_text().splitlines()
    (victim / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    assert main(argv) == 0
    again = logs(out)
    assert again["b-seed1338"] != first["b-seed1338"]
    assert {k: v for k, v in again.items() if k != "b-seed1338"} == {k: v for k, v in first.items()
                                                                    if k != "b-seed1338"}
    assert json.loads((out / "summary.json").read_text())["arms"]["b"]["final_loss"]["n"] == 2

    # Loss-only runs sharing a device: times come from steps to target x the given step times.
    common = [*tiny, f"--data.train_files={text_shards}", "--train.val_every=1", "--train.log_every=1",
              "--train.steps=2", "--train.save_final_checkpoint=false"]
    plan = make_plan(preset="tiny-cpu", common=common, a="--optim.muon_lr=0.02", b="", seeds=2, out=out)
    shared = summarize(plan, "10.5", concurrent=2, step_ms={"a": 100.0, "b": 50.0})
    assert shared["times_are_speed_figures"] is False
    for r in shared["arms"]["b"]["runs"]:
        if r.get("steps_to_target") is not None:
            assert r["time_to_target_s"] == pytest.approx(r["steps_to_target"] * 0.05)
    assert summarize(plan, "10.5", concurrent=2)["paired"]["time_to_target_s"]["note"].startswith("unavailable")


def test_a_run_directory_of_another_configuration_is_refused(tmp_path):
    """A finished run of other settings in ab's --out would be skipped and reported as this plan's."""
    from speedgpt.ab.plan import AbError
    from speedgpt.ab.run import check_existing
    from speedgpt.config import resolve
    from speedgpt.planner import plan_run
    from speedgpt.rundir import RunDir

    run = plan_for(tmp_path).runs[0]  # arm A, seed 1337, muon_lr 0.04
    check_existing(run)  # no run there yet
    overrides = [o for o in run.argv if o.startswith("--") and "." in o.split("=", 1)[0]]  # the run's own keys
    assert "--optim.muon_lr=0.04" in overrides
    RunDir(run.run_dir).write_config(plan_run(resolve("tiny-cpu", None, overrides)).cfg)
    check_existing(run)  # this plan's own run: skipped or resumed
    other = plan_run(resolve("tiny-cpu", None, [*overrides, "--optim.muon_lr=0.02"])).cfg
    RunDir(run.run_dir).write_config(other)
    with pytest.raises(AbError, match=r"holds a run of another configuration \(differs in optim.muon_lr\)"):
        check_existing(run)



@pytest.mark.parametrize("how", CONFIG_DAMAGE)
def test_a_finished_run_whose_config_is_unreadable_is_refused_not_counted(tmp_path, capsys, monkeypatch, how):
    """(audit 29b) A finished run in --out whose config.toml was emptied, cut short, made invalid TOML or removed was
    taken for no run: its settings went unchecked, its metrics were counted as this plan's, exit 0."""
    import speedgpt.ab.run as ab
    from speedgpt.config import resolve
    from speedgpt.planner import plan_run
    from speedgpt.rundir import RunDir

    plan = plan_for(tmp_path)
    for run in plan.runs:  # each finished: config and final validation written as train writes them
        overrides = [o for o in run.argv if o.startswith("--") and "." in o.split("=", 1)[0]]
        rundir = RunDir(run.run_dir)
        rundir.root.mkdir(parents=True)
        rundir.write_config(plan_run(resolve("tiny-cpu", None, overrides)).cfg)
        final = {"step": run.steps, "tokens": 1, "time_s": 1.0, "val_loss": 3.0}
        rundir.metrics_path.write_text(json.dumps(final) + "\n")
    damaged = plan.runs[0].run_dir
    damage_run_config(damaged, how)
    monkeypatch.setattr(ab.subprocess, "Popen", None)  # nothing may be trained
    assert main(["--preset", "tiny-cpu", "--a", "--optim.muon_lr=0.04", "--b", "", "--seeds", "2",
                 "--devices", "cpu", "--out", str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and str(damaged) in line and "restore it" in line and f"delete {damaged}" in line, line


class FakeProcess:
    """Stands in for a training subprocess that fails at once: B seed 1338 diverges, the rest crash."""
    launched: list[list[str]] = []

    def __init__(self, cmd, stdout, stderr, env, cwd=None):
        FakeProcess.launched.append(cmd)
        diverges = cmd[-1].endswith("b-seed1338")
        stdout.write("FloatingPointError: training loss became nan at step 3\n" if diverges else
                     "RuntimeError: CUDA error: an illegal memory access was encountered\n")
        stdout.flush()

    def wait(self):
        return 1


def test_failed_runs_are_reported_with_their_seed(tmp_path, capsys, monkeypatch):
    import speedgpt.ab.run as ab

    monkeypatch.setattr(ab.subprocess, "Popen", FakeProcess)
    FakeProcess.launched = []
    out = tmp_path / "ab"
    argv = ["--preset", "tiny-cpu", "--a", "--optim.muon_lr=0.04", "--b", "", "--seeds", "2", "--devices", "cpu",
            "--out", str(out)]
    assert main(argv) == 1  # no complete pair: the comparison did not happen, and the exit says so
    summary = json.loads((out / "summary.json").read_text())
    assert sorted((f["arm"], f["seed"], f["status"]) for f in summary["failures"]) == [
        ("a", 1337, "crashed"), ("a", 1338, "crashed"), ("b", 1337, "crashed"), ("b", 1338, "diverged")]
    text = capsys.readouterr().out
    assert "FAILED: B seed 1338 diverged" in text and "FAILED: A seed 1337 crashed" in text
    assert summary["paired"]["final_loss"]["n"] == 0
    # A second `ab` retries the crashes but not the divergence (deterministic: it would diverge again).
    FakeProcess.launched = []
    assert main(argv) == 1
    assert len(FakeProcess.launched) == 3 and not any(c[-1].endswith("b-seed1338") for c in FakeProcess.launched)


def test_a_half_run_with_a_checkpoint_is_resumed_not_restarted(tmp_path):
    from speedgpt.ab.run import train_command
    from speedgpt.config import load_preset, save_toml
    from speedgpt.rundir.checkpoint import save_checkpoint

    run = plan_for(tmp_path).runs[0]
    assert train_command(run)[4:6] == ["--preset", "tiny-cpu"]  # nothing there: a fresh run
    run.run_dir.mkdir(parents=True)
    save_toml(load_preset("tiny-cpu"), run.run_dir / "config.toml")
    save_checkpoint(run.run_dir / "checkpoints", 50, {}, [], {"tokens": 0, "train_time_s": 1.0}, keep=0)
    assert train_command(run)[4:] == ["--resume", str(run.run_dir)]


def test_runs_start_in_the_launch_directory_even_if_it_was_replaced(tmp_path, monkeypatch):
    """A checkout re-synced under a running `ab` replaces its working directory; children that inherit
    the deleted directory cannot import torch (seen on a GPU machine). They must start there by path."""
    import shutil
    import sys

    import speedgpt.ab.run as ab
    from speedgpt.ab.plan import make_plan

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    plan = make_plan(preset="tiny-cpu", common=[], a="--optim.muon_lr=0.04", b="", seeds=2, out=work / "ab",
                    allow_same=False, seed_base=None, save_checkpoint=False)
    probe = "import os, torch; print('cwd', os.getcwd())"
    monkeypatch.setattr(ab, "train_command", lambda run: [sys.executable, "-c", probe, "train", "--preset"])
    shutil.rmtree(work)  # the directory is replaced while `ab` runs
    work.mkdir()
    (work / "ab").mkdir()
    ab.execute(plan, ["cpu"], 1, print_fn=lambda *_: None, workdir=str(work))
    logs = [(run.run_dir / ab.LOG_FILE).read_text() for run in plan.runs]
    assert all(f"cwd {work}" in log for log in logs), logs[0][-300:]


def test_a_run_stopped_by_its_time_budget_is_finished_and_says_so(tmp_path):
    from speedgpt.ab.run import is_finished
    from speedgpt.ab.summary import run_result

    run = plan_for(tmp_path).runs[0]
    run.run_dir.mkdir(parents=True)
    records = [{"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 5.0},
               {"step": 7, "tokens": 70, "time_s": 9.0, "event": "time_budget", "budget_s": 9.0},
               {"step": 7, "tokens": 70, "time_s": 9.0, "val_loss": 4.0}]
    (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert run.steps > 7 and is_finished(run)
    result = run_result(run)
    assert (result["status"], result["ended_by"], result["steps"], result["final_loss"]) == \
        ("finished", "time budget", 7, 4.0)



def test_a_runs_start_compile_and_warmup_is_its_own_column(tmp_path):
    """Time to target leaves out the compile; the table says how long the start took beside it."""
    from speedgpt.ab.summary import format_table, summarize

    plan = plan_for(tmp_path)
    for i, run in enumerate(plan.runs):
        run.run_dir.mkdir(parents=True)
        records = [{"event": "warmup", "step": 0, "tokens": 0, "time_s": 0.0, "warmup_s": 10.0 + i},
                   {"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 5.0},
                   {"step": run.steps, "tokens": 70, "time_s": 9.0, "val_loss": 4.0}]
        (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = summarize(plan, "4.5")
    starts = [r["start_s"] for k in ("a", "b") for r in summary["arms"][k]["runs"]]
    assert sorted(starts) == [10.0 + i for i in range(len(plan.runs))]
    table = format_table(summary)
    assert "start s" in table.splitlines()[0] and "  10.0  finished" in table and "compile + warmup" in table

class FinishingProcess:
    """Stands in for a training subprocess on a GPU: logs its launch (with the GPU it was given) and its
    wait, and leaves a finished run's metrics (validation at steps 0 and 100, final loss by arm and seed)."""
    events: list[tuple] = []

    def __init__(self, cmd, stdout, stderr, env, cwd=None):
        run_dir = Path(cmd[-1])
        self.name = run_dir.name
        FinishingProcess.events.append(("launch", self.name, env.get("CUDA_VISIBLE_DEVICES")))
        final = 4.0 + (0.1 if self.name.startswith("a") else 0.0) + 0.01 * (int(self.name[-4:]) - 1337)
        records = [{"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 11.0},
                   {"step": 100, "tokens": 102400, "time_s": 50.0, "val_loss": final}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def wait(self):
        FinishingProcess.events.append(("wait", self.name))
        return 0


def test_on_two_gpus_a_and_b_of_a_seed_run_at_once_one_gpu_each(tmp_path, monkeypatch, capsys):
    """Issue 15: "on a machine with several GPUs, A and B of one seed run at once, one GPU each" (no GPU
    needed: the subprocesses are stand-ins; what is checked is when each starts and which GPU it sees)."""
    import speedgpt.ab.plan as ab_plan
    import speedgpt.ab.run as ab

    monkeypatch.setattr(ab.subprocess, "Popen", FinishingProcess)
    monkeypatch.setattr(ab_plan, "visible_gpus", lambda: 2)  # --devices 0,1 names GPUs that must be here
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # (which, when it lists ids, are its ids)
    FinishingProcess.events = []
    out = tmp_path / "ab"
    argv = ["--preset", "tiny-cpu", "--a", "--optim.muon_lr=0.04", "--b", "", "--seeds", "2", "--devices", "0,1",
            "--out", str(out)]
    assert main(argv) == 0
    assert FinishingProcess.events == [
        ("launch", "a-seed1337", "0"), ("launch", "b-seed1337", "1"), ("wait", "a-seed1337"), ("wait", "b-seed1337"),
        ("launch", "a-seed1338", "1"), ("launch", "b-seed1338", "0"), ("wait", "a-seed1338"), ("wait", "b-seed1338")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["devices"] == ["0", "1"] and summary["times_are_speed_figures"] is True
    assert summary["paired"]["final_loss"]["diffs"] == pytest.approx([-0.1, -0.1])


@pytest.mark.parametrize("gpus, says", [
    (0, "--devices 0,1: no GPU 0, 1 here (this machine sees no GPU); use --devices auto or cpu"),
    (1, "--devices 0,1: no GPU 1 here (this machine sees 1 GPU(s), 0..0); use --devices auto, cpu or indices below 1"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_devices_that_are_not_here_are_refused(gpus, says, dry_run, tmp_path, monkeypatch, capsys):
    """A new-user audit: --devices 0,1 on a CPU box went on and launched its runs. The dry run refuses too (it shows
    what this machine would run, and checks --out alike); nothing is launched or written."""
    import speedgpt.ab.plan as ab_plan
    import speedgpt.ab.run as ab

    def launched(*args, **kwargs):
        raise AssertionError("a run was launched")

    monkeypatch.setattr(ab.subprocess, "Popen", launched)
    monkeypatch.setattr(ab_plan, "visible_gpus", lambda: gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = tmp_path / "ab"
    argv = ["--preset", "tiny-cpu", "--a", "--optim.muon_lr=0.04", "--b", "", "--seeds", "2", "--devices", "0,1",
            "--out", str(out), *(["--dry-run"] if dry_run else [])]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"speedgpt ab: error: {says}" and not captured.out
    assert not out.exists()
    monkeypatch.setattr(ab_plan, "visible_gpus", lambda: 2)
    assert main(argv if dry_run else [*argv, "--dry-run"]) == 0  # with the GPUs here: planned
    assert "CUDA_VISIBLE_DEVICES=1 " in capsys.readouterr().out
    # Under a scheduler's CUDA_VISIBLE_DEVICES=4,5 the ids are 4 and 5 (each run's own CUDA_VISIBLE_DEVICES)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert main([*argv, "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == "speedgpt ab: error: --devices 0,1: GPU 0, 1 is not in " \
        "CUDA_VISIBLE_DEVICES=4,5; use --devices auto, cpu or ids from that list"
    at = [a if a != "0,1" else "4,5" for a in argv]
    assert main([*at, "--dry-run"]) == 0 and "CUDA_VISIBLE_DEVICES=5 " in capsys.readouterr().out
    from speedgpt.ab.plan import detect_devices

    assert detect_devices("auto") == ["4", "5"]  # not 0 and 1, GPUs outside the allocation


def test_a_target_never_reached_is_stated_not_an_error(tmp_path, monkeypatch, capsys):
    import speedgpt.ab.run as ab

    monkeypatch.setattr(ab.subprocess, "Popen", FinishingProcess)
    out = tmp_path / "ab"
    argv = ["--preset", "tiny-cpu", "--a", "--optim.muon_lr=0.04", "--b", "", "--seeds", "2", "--devices", "cpu",
            "--target-loss", "3.5", "--out", str(out)]  # every run ends at 4.0 or above
    assert main(argv) == 0  # the loss comparison stands; the time comparison is stated as impossible
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert sorted((u["arm"], u["seed"]) for u in summary["unreached"]) == [("a", 1337), ("a", 1338), ("b", 1337),
                                                                           ("b", 1338)]
    assert summary["paired"]["time_to_target_s"]["n"] == 0 and summary["paired"]["time_to_target_s"]["pairs_dropped"] == 2
    assert "target not reached: A seed 1337 (final 4.1000)" in text
    assert "B - A time to target: mean -, 95% CI -, n=0: 0 complete pair(s)" in text
    assert summary["paired"]["final_loss"]["n"] == 2


def test_a_budget_preset_plans_the_config_its_runs_save(tmp_path):
    # d12 derives its steps and batch from tokens per parameter and scales lrs by width: a run saves the
    # resolved values, so the plan's config (what ab/run.py checks a finished run against) must have them.
    from speedgpt.config import load_preset
    from speedgpt.planner import plan_run

    plan = make_plan(preset="d12", common=[], a="--optim.muon_lr=0.04", b="", seeds=2, out=tmp_path)
    want = plan_run(load_preset("d12")).cfg
    assert {r.steps for r in plan.runs} == {want.train.steps}
    assert {(r.config["optim"]["tuned_width"], r.config["train"]["batch_tokens"]) for r in plan.runs} == {
        (0, want.train.batch_tokens)}


def test_a_run_that_exits_0_unfinished_names_the_fix(tmp_path, capsys, monkeypatch):
    """A run stopped in its last step holds a checkpoint at its end but no final validation: its resume says
    "complete, nothing to train ... --extend" and exits 0, and ab reported that line (a fix that trains further, not
    the missing validation) as the failure on every rerun."""
    import speedgpt.ab.run as ab

    class Complete(FakeProcess):
        def __init__(self, cmd, stdout, stderr, env, cwd=None):
            FakeProcess.launched.append(cmd)
            stdout.write("speedgpt train: x is complete (step 12 of 12); nothing to train. To train it further: "
                         "speedgpt train --resume x --train.steps=N --extend\n")
            stdout.flush()

        def wait(self):
            return 0

    monkeypatch.setattr(ab.subprocess, "Popen", Complete)
    out = tmp_path / "ab"
    argv = ["--preset", "tiny-cpu", "--a", "--optim.muon_lr=0.04", "--b", "", "--seeds", "2", "--devices", "cpu",
            "--out", str(out)]
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert (f"FAILED: A seed 1337 crashed: train exited 0 but the run's metrics hold no final validation; delete "
            f"{out / 'a-seed1337'} and run the same command again") in text
    assert "--extend" not in text.split("FAILED", 1)[1]


def test_verdict_gives_each_direction_its_own_p_value():
    """p_b_better is the p-value of "B is lower": 0.978 is no evidence for that, and p = 0.022 for "B is higher". The
    verdict printed it as "p(B lower)=0.978", which reads as a 98 % chance that B is lower."""
    assert verdict({"p_b_better": 0.978}, "final_loss") == "B higher final_loss (p=0.022, one-sided for B higher)"
    assert verdict({"p_b_better": 0.02}, "final_loss") == "B lower final_loss (p=0.02)"
    assert verdict({"p_b_better": 0.5}, "final_loss") == "no significant final_loss difference (p=0.5)"


def test_steps_to_target_are_paired_beside_the_times(tmp_path):
    """An arm that changes only the math compares by steps to target (times the bench step time): the measured times
    carry each machine's step-time noise (wave 27b: a first run 2.3 % slower gave its pair -2.45 s while B needed 1.3
    steps more). The summary pairs steps too, and the table prints both, with --concurrent as without."""
    from speedgpt.ab.summary import format_table, summarize

    plan = plan_for(tmp_path)
    for run in plan.runs:
        run.run_dir.mkdir(parents=True)
        slow = 1.05 if (run.arm, run.seed) == ("a", 1337) else 1.0  # A's first run steps 5 % slower
        at_100 = 4.0 if run.arm == "a" else 4.2  # B reaches 4.5 later: at step 62.5 against A's 50
        records = [{"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 5.0},
                   {"step": 100, "tokens": 700, "time_s": 10.0 * slow, "val_loss": at_100}]
        (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for concurrent in (1, 2):
        summary = summarize(plan, "4.5", concurrent=concurrent)
        steps = summary["paired"]["steps_to_target"]
        assert steps["n"] == 2 and steps["diffs"] == pytest.approx([12.5, 12.5])
    summary = summarize(plan, "4.5")
    assert summary["paired"]["time_to_target_s"]["diffs"] == pytest.approx([1.25 - 0.25, 1.25])
    table = format_table(summary)
    assert "steps to target" in table.splitlines()[0]
    assert "B - A steps to target: mean +12.5, 95% CI [+12.5, +12.5], n=2" in table
