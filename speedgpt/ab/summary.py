"""The results of an A/B: each run's curve, final loss and time to the target loss (rundir/target.py,
the same figure `speedgpt report` gives), then per arm and paired over seeds (stats.py), and the
printed table."""

from __future__ import annotations

import math

from ..rundir.target import TARGET_METHOD, to_target
from .plan import ARMS, AbError, Plan, Run
from .run import failure_of, read_records
from .stats import describe, paired


def run_result(run: Run) -> dict:
    """A run's status and, once finished, its curve and final figures (`to_target` adds the target's)."""
    from ..rundir.metrics import ended_by

    records = read_records(run.run_dir)
    recs = [r for r in records if "val_loss" in r and r.get("event") != "eval"]
    fail = failure_of(run)
    how = ended_by(records, run.steps)
    out = {"arm": run.arm, "seed": run.seed, "run_dir": str(run.run_dir), "status": "finished"}
    if fail or how is None:
        out["status"] = fail["status"] if fail else "missing"
        if fail:
            out["error"] = fail.get("last_line", "")
        return out
    out["ended_by"] = how
    curve = [{"step": r["step"], "tokens": r.get("tokens"), "time_s": r.get("time_s"), "val_loss": r["val_loss"]}
             for r in recs]
    final = curve[-1]
    out.update(curve=curve, final_loss=final["val_loss"], steps=final["step"], tokens=final["tokens"],
               train_time_s=final["time_s"], step_ms=1000 * final["time_s"] / max(1, final["step"]))
    # Compile + warmup of the run's first start, outside its training time: what a user waits for besides
    # the time to target (wave 8: 214 s for speedrun-latest against 37 s for speedrun-124m).
    out["start_s"] = next((r["warmup_s"] for r in records if r.get("event") == "warmup"), None)
    return out


def resolve_target(spec: str | None, results: list[dict]) -> float | None:
    """A number, or "a" / "b": the mean final loss of that arm's finished runs."""
    if spec is None:
        return None
    if spec.lower() in ARMS:
        finals = [r["final_loss"] for r in results if r["arm"] == spec.lower() and "final_loss" in r]
        return sum(finals) / len(finals) if finals else None
    try:
        value = float(spec)
    except ValueError:
        raise AbError(f"--target-loss {spec!r}: give a loss such as 3.28, or a / b (that arm's mean final loss)")
    if not math.isfinite(value) or value <= 0:  # no run reaches it: every time to target would be missing
        raise AbError(f"--target-loss {spec!r}: a validation loss is > 0; give one such as 3.28, or a / b (that arm's "
                      f"mean final loss)")
    return value


def summarize(plan: Plan, target_spec: str | None, *, concurrent: int = 1,
              step_ms: dict[str, float] | None = None) -> dict:
    results = [run_result(r) for r in plan.runs]
    target = resolve_target(target_spec, results)  # may be a mean of the results: each run's metrics read once
    for r in results:
        if target is not None and "curve" in r:
            r.update(to_target(r["curve"], target))
    speed_ok = concurrent == 1
    for r in results:
        if "final_loss" not in r or target is None:
            continue
        if not speed_ok:  # shared GPUs: measured times are not speed figures
            r["measured_time_to_target_s"] = r.pop("time_to_target_s")
            ms = (step_ms or {}).get(r["arm"])
            st = r.get("steps_to_target")
            r["time_to_target_s"] = st * ms / 1000 if (ms is not None and st is not None) else None
    by_arm = {k: {r["seed"]: r for r in results if r["arm"] == k} for k in ARMS}
    summary: dict = {
        "command": None, "target_loss": target, "target_spec": target_spec, "target_method": TARGET_METHOD,
        "seeds": plan.seeds,
        "times_are_speed_figures": speed_ok, "concurrent": concurrent, "step_ms_given": step_ms or None,
        "arms": {}, "paired": {}, "failures": [], "unreached": [],
        "configs": {k: {"preset": plan.arms[k].preset, "overrides": plan.arms[k].overrides} for k in ARMS},
        "common_overrides": plan.common,
    }
    for r in results:
        if r["status"] != "finished":
            summary["failures"].append({"arm": r["arm"], "seed": r["seed"], "status": r["status"],
                                        "error": r.get("error", ""), "run_dir": r["run_dir"]})
        elif target is not None and r.get("steps_to_target") is None:
            summary["unreached"].append({"arm": r["arm"], "seed": r["seed"], "final_loss": r["final_loss"]})
    metrics = ["final_loss", "step_ms", "train_time_s"] + (["time_to_target_s", "steps_to_target"]
                                                            if target is not None else [])
    for k in ARMS:
        arm = {"runs": [by_arm[k][s] for s in plan.seeds]}
        for m in metrics:
            vals = {s: by_arm[k][s].get(m) for s in plan.seeds}
            got = [v for v in vals.values() if v is not None]
            arm[m] = {"per_seed": vals, **describe(got)}
        summary["arms"][k] = arm
    # Steps to target paired too: where the arms change only the math (steps cost the same), it is time to target
    # without the step time's machine noise (wave 27b: a machine's first run stepped 2.3 % slower, -2.45 s of a pair's
    # time that its steps, +1.3, did not show).
    for m in ["final_loss"] + (["time_to_target_s", "steps_to_target"] if target is not None else []):
        pairs = [(by_arm["a"][s].get(m), by_arm["b"][s].get(m)) for s in plan.seeds]
        full = [(x, y) for x, y in pairs if x is not None and y is not None]
        res = paired([x for x, _ in full], [y for _, y in full])
        res["pairs_dropped"] = len(pairs) - len(full)
        if m == "time_to_target_s" and not speed_ok and not step_ms:
            res = {"n": 0, "note": "unavailable: runs shared GPUs (--concurrent > 1); give --step-ms A=..,B=.. "
                                   "from `speedgpt bench` to turn steps to target into times"}
        summary["paired"][m] = res
    return summary


def verdict(p: dict, what: str) -> str:
    if p.get("p_b_better") is None:
        return p.get("note") or "no test"
    if p["p_b_better"] < 0.05:
        return f"B lower {what} (p={p['p_b_better']:.3g})"
    if p["p_b_better"] > 0.95:  # the one-sided test the other way: its p-value is 1 - this one's
        return f"B higher {what} (p={1 - p['p_b_better']:.3g}, one-sided for B higher)"
    return f"no significant {what} difference (p={p['p_b_better']:.3g})"


def fmt_or_dash(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(summary: dict) -> str:
    lines = [f"{'arm':<4}{'seed':>7}{'final loss':>12}{'step ms':>10}{'steps to target':>17}{'time to target':>16}"
             f"{'start s':>9}  status"]
    for k in ARMS:
        for r in summary["arms"][k]["runs"]:
            lines.append(f"{k.upper():<4}{r['seed']:>7}{fmt_or_dash(r.get('final_loss'), '.4f'):>12}"
                         f"{fmt_or_dash(r.get('step_ms'), '.1f'):>10}"
                         f"{fmt_or_dash(r.get('steps_to_target'), '.1f'):>17}"
                         f"{fmt_or_dash(r.get('time_to_target_s'), '.2f'):>16}"
                         f"{fmt_or_dash(r.get('start_s'), '.1f'):>9}  {r['status']}")
    for k in ARMS:
        f = summary["arms"][k]["final_loss"]
        lines.append(f"{k.upper()} mean final loss {fmt_or_dash(f['mean'], '.4f')} +- {fmt_or_dash(f['std'], '.4f')} (n={f['n']})")
    for m, what in (("final_loss", "loss"), ("time_to_target_s", "time to target"),
                    ("steps_to_target", "steps to target")):
        p = summary["paired"].get(m)
        if not p:
            continue
        ci = p.get("ci95")
        ci_s = f"[{ci[0]:+.4g}, {ci[1]:+.4g}]" if ci else "-"
        lines.append(f"B - A {what}: mean {fmt_or_dash(p.get('mean_diff'), '+.4g')}, 95% CI {ci_s}, n={p.get('n')}: "
                     f"{verdict(p, what)}" + (" (time to target without the step time's noise, where the arms' "
                                             "steps cost the same: an arm that changes only the math)"
                                             if m == "steps_to_target" else ""))
    if summary["target_loss"] is not None:
        lines.append(f"target loss {summary['target_loss']:.4f}"
                     + ("" if summary["times_are_speed_figures"] else " (times: steps to target x --step-ms; "
                        "measured times are not speed figures with --concurrent > 1)"))
        lines.append(TARGET_METHOD)
    if any(r.get("start_s") is not None for k in ARMS for r in summary["arms"][k]["runs"]):
        lines.append("start s: compile + warmup before training, not in the times above (runs started at once share "
                     "the host's cores; a warm compile cache shortens it)")
    for f in summary["failures"]:
        lines.append(f"FAILED: {f['arm'].upper()} seed {f['seed']} {f['status']}: {f['error']} ({f['run_dir']})")
    for u in summary["unreached"]:
        lines.append(f"target not reached: {u['arm'].upper()} seed {u['seed']} (final {u['final_loss']:.4f})")
    return "\n".join(lines)
