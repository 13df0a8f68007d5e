"""Time to a target loss (rundir/target.py): the crossing of a run's validation curve, interpolated
between evaluations, and the same figures from `speedgpt report` and `speedgpt ab` for one run."""

from __future__ import annotations

import json
import math

import pytest

from speedgpt.ab.plan import make_plan
from speedgpt.ab.summary import format_table
from speedgpt.ab.summary import summarize as ab_summarize
from speedgpt.report import print_summary, summary_table, write_report
from speedgpt.rundir.target import TARGET_METHOD, crossing, to_target


def test_between_evaluations_the_crossing_is_linear():
    # 5.0 at x=0, 4.0 at x=10, 3.0 at x=20: target 3.5 is halfway between x=10 and x=20.
    assert crossing([(0, 5.0), (10, 4.0), (20, 3.0)], 3.5) == pytest.approx(15.0)
    # 3.7 is 0.3 of the way from 4.0 down to 3.0: x = 10 + 0.3 * 10.
    assert crossing([(0, 5.0), (10, 4.0), (20, 3.0)], 3.7) == pytest.approx(13.0)


def test_an_evaluation_exactly_at_the_target_is_the_crossing():
    assert crossing([(0.1, 5.0), (0.3, 4.0), (0.7, 3.0)], 4.0) == 0.3  # exactly, not 0.1 + (0.3 - 0.1)
    assert crossing([(0, 3.0), (10, 2.0)], 3.0) == 0


def test_a_curve_below_the_target_from_its_first_evaluation_crosses_there():
    assert crossing([(7, 3.0), (10, 2.0)], 3.5) == 7  # nothing earlier to interpolate from


def test_a_target_never_reached_gives_none():
    assert crossing([(0, 5.0), (10, 4.0)], 3.5) is None
    assert crossing([], 3.5) is None
    assert to_target([{"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 5.0}], 3.5) == {
        "time_to_target_s": None, "steps_to_target": None, "tokens_to_target": None}


def test_a_non_monotone_curve_keeps_its_first_crossing():
    # Down through 3.5 between x=10 and x=20, back up above it, down again later: the first counts.
    curve = [(0, 5.0), (10, 4.0), (20, 3.0), (30, 3.9), (40, 3.2)]
    assert crossing(curve, 3.5) == pytest.approx(15.0)
    # A bump above the target before the first crossing interpolates from the evaluation just before.
    assert crossing([(0, 5.0), (10, 3.8), (20, 4.2), (30, 3.2)], 3.7) == pytest.approx(25.0)


def test_to_target_reads_time_steps_and_tokens_and_skips_unusable_records():
    evals = [{"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 10.0},
             {"step": 100, "tokens": 1000, "time_s": 20.0, "val_loss": float("nan")},  # no place on a curve
             {"step": 200, "tokens": 2000, "time_s": 40.0, "val_loss": 4.0},
             {"step": 300, "tokens": 3000, "time_s": 70.0, "val_loss": 2.0}]
    got = to_target(evals, 3.0)
    assert got == pytest.approx({"time_to_target_s": 55.0, "steps_to_target": 250.0, "tokens_to_target": 2500.0})
    del evals[2]["tokens"]  # an old record without tokens: the tokens curve goes from step 0 to step 300
    assert to_target(evals, 3.0)["tokens_to_target"] == pytest.approx(3000 * 7 / 8)


def test_report_and_ab_give_the_same_time_to_target_for_one_run(tmp_path, capsys):
    """Issue 28 item 6: on one GPU run report said 99.9 s (the first evaluation at or below the target)
    and ab 85.1 s (interpolated). Here the first evaluation below the target is at 100 s, the
    interpolated crossing at 85 s: both commands must say 85."""
    plan = make_plan(preset="tiny-cpu", common=[], a="--optim.muon_lr=0.04", b="", seeds=2, out=tmp_path)
    steps = plan.runs[0].steps
    curve = [(0, 0.0, 11.0), (steps // 2, 50.0, 4.0), (steps, 100.0, 3.0)]
    for run in plan.runs:
        run.run_dir.mkdir(parents=True)
        records = []
        for step, t, loss in curve:
            if step:
                records.append({"step": step, "tokens": 512 * step, "time_s": t, "train_loss": loss + 0.1})
            records.append({"step": step, "tokens": 512 * step, "time_s": t, "val_loss": loss})
        (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    target = 3.3  # 0.7 of the way from 4.0 (50 s) to 3.0 (100 s): 85 s
    ab = ab_summarize(plan, str(target))["arms"]["a"]["runs"][0]
    (report,) = summary_table([plan.runs[0].run_dir], target_loss=target)
    keys = ["time_to_target_s", "steps_to_target", "tokens_to_target"]
    assert report["time_to_target_s"] == pytest.approx(85.0)
    assert {k: report[k] for k in keys} == {k: ab[k] for k in keys}
    assert math.isclose(report["steps_to_target"], 0.85 * steps)


def test_report_and_ab_say_how_the_time_is_computed(tmp_path, capsys):
    plan = make_plan(preset="tiny-cpu", common=[], a="--optim.muon_lr=0.04", b="", seeds=2, out=tmp_path)
    run_dir = plan.runs[0].run_dir
    run_dir.mkdir(parents=True)
    records = [{"step": 0, "tokens": 0, "time_s": 0.0, "val_loss": 11.0},
               {"step": plan.runs[0].steps, "tokens": 9000, "time_s": 9.0, "val_loss": 3.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = summary_table([run_dir], target_loss=4.0)
    print_summary(rows)
    assert TARGET_METHOD in " ".join(capsys.readouterr().out.split())  # rich may wrap the line
    assert TARGET_METHOD in write_report([run_dir], tmp_path / "out", target_loss=4.0)["html"].read_text()
    assert TARGET_METHOD in format_table(ab_summarize(plan, "4.0"))
    print_summary(summary_table([run_dir]))  # no target: no line about one
    assert "time to target" not in capsys.readouterr().out
