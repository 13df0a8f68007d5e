"""The lab-notebook row of an A/B: one markdown table row for docs/experiments.md's A/B log."""

from __future__ import annotations

import datetime
import json

from .plan import Plan
from .summary import fmt_or_dash, verdict


def notebook_row(summary: dict, device: str, commit: str) -> str:
    """One markdown table row for docs/experiments.md's A/B log."""
    fa, fb = summary["arms"]["a"]["final_loss"], summary["arms"]["b"]["final_loss"]
    pl = summary["paired"]["final_loss"]
    pt = summary["paired"].get("time_to_target_s") or {}

    def diff(p, spec):
        if p.get("mean_diff") is None:
            return "-"
        ci = p.get("ci95")
        return f"{p['mean_diff']:{spec}} [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else f"{p['mean_diff']:{spec}}"

    p_of = lambda p: fmt_or_dash(p.get("p_b_better"), ".3g")  # noqa: E731
    return (f"| {datetime.date.today().isoformat()} | {device} | {commit} | `{summary['command']}` | "
            f"{pl.get('n')} | {fmt_or_dash(fa['mean'], '.4f')} | {fmt_or_dash(fb['mean'], '.4f')} | {diff(pl, '+.4f')} | "
            f"{p_of(pl)} | {diff(pt, '+.2f') if pt else '-'} | {p_of(pt) if pt else '-'} | "
            f"{verdict(pl, 'loss')}; {len(summary['failures'])} failed |")


NOTEBOOK_HEADER = ("| date | device | commit | command | pairs | A final | B final | B-A loss [95% CI] | p | "
                   "B-A time to target s [95% CI] | p | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def device_name(plan: Plan) -> str:
    for run in plan.runs:
        try:
            return json.loads((run.run_dir / "env.json").read_text()).get("device") or "unknown"
        except (FileNotFoundError, json.JSONDecodeError):
            continue
    return "unknown"
