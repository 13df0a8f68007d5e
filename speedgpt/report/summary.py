"""One summary row per run: final and best val loss, time and tokens to a target, throughput."""

from __future__ import annotations

import os
import statistics
from typing import Any, Sequence

from ..rundir.metrics import finite
from ..rundir.target import TARGET_AXES, TARGET_METHOD, to_target
from .runs import RunData, load_runs
from .tables import _fmt, _print_table, fmt_count, fmt_duration


def summarize(run: RunData, target_loss: float | None = None) -> dict[str, Any]:
    """One summary row; a value is None when the run did not log what it needs."""
    recs, train, evals = run.records, run.train, run.evals

    def col(rows, key):
        return [r[key] for r in rows if finite(r.get(key))]

    def median(values):
        return statistics.median(values) if values else None

    best = min(evals, key=lambda r: r["val_loss"], default=None)
    # The speedrun's "time to target", computed as `speedgpt ab` does (rundir/target.py).
    reached = to_target(evals, target_loss) if target_loss is not None else dict.fromkeys(TARGET_AXES)
    return {
        "run": run.label,
        "dir": str(run.dir),
        "final_val_loss": evals[-1]["val_loss"] if evals else None,
        "best_val_loss": best["val_loss"] if best else None,
        "best_val_step": best["step"] if best else None,
        "final_train_loss": train[-1]["train_loss"] if train else None,
        "steps": max((r["step"] for r in recs), default=None),
        "tokens": max(col(recs, "tokens"), default=None),
        "wall_time_s": max(col(recs, "time_s"), default=None),
        "target_loss": target_loss,
        "target_reached": reached["steps_to_target"] is not None,
        **reached,
        "median_tok_per_s": median(col(train, "tok_per_s")),
        "median_mfu": median(col(train, "mfu")),
        "peak_mem_gib": max(col(recs, "peak_mem_gib"), default=None),
    }


def summary_table(run_dirs: Sequence[str | os.PathLike], *, target_loss: float | None = None) -> list[dict]:
    """Summary rows (dicts of raw numbers, see ``summarize``), one per run dir."""
    return [summarize(run, target_loss) for run in load_runs(run_dirs)]


def sft_notes(runs: Sequence[RunData]) -> list[str]:
    """A line per SFT run: what it evaluated (held-out assistant loss, ChatCORE), which the table's val columns do
    not show (it is not a val loss on the pretraining data, so an A/B of it with a base run would mislead)."""
    lines = []
    for run in runs:
        if evals := run.sft_evals:
            first, last = evals[0], evals[-1]
            chat = f", ChatCORE {last['chatcore']:+.3f}" if finite(last.get("chatcore")) else ""
            lines.append(f"{run.label}: SFT run, held-out assistant loss {first['heldout_loss']:.4f} @{first['step']} "
                         f"-> {last['heldout_loss']:.4f} @{last['step']}{chat} (`speedgpt eval RUN --chat` scores it)")
    return lines


def _target_of(rows: list[dict]) -> float | None:
    return next((r["target_loss"] for r in rows if r.get("target_loss") is not None), None)


def target_note(rows: list[dict]) -> str | None:
    """The line under the table that says how its time to target is computed; None without a target."""
    return TARGET_METHOD if _target_of(rows) is not None else None


def format_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Headers and display strings shared by the HTML, rich and PNG renderings."""
    target = _target_of(rows)
    headers = ["run", "final val", "best val", "steps", "tokens", "wall time"]
    if target is not None:
        headers += [f"time to {target:g}", f"tokens to {target:g}"]
    headers += ["tok/s (median)", "MFU (median)", "peak mem"]
    out = []
    for r in rows:
        best = _fmt(r["best_val_loss"], ".4f")
        if r["best_val_step"] is not None:
            best += f" @{r['best_val_step']}"
        line = [r["run"], _fmt(r["final_val_loss"], ".4f"), best, _fmt(r["steps"], "d"),
                fmt_count(r["tokens"]), fmt_duration(r["wall_time_s"])]
        if target is not None:
            if r["target_reached"]:
                line += [fmt_duration(r["time_to_target_s"]), fmt_count(r["tokens_to_target"])]
            else:
                line += ["not reached", "not reached"]
        line += [fmt_count(r["median_tok_per_s"]), _fmt(None if r["median_mfu"] is None else 100 * r["median_mfu"], ".1f", "%"),
                 _fmt(r["peak_mem_gib"], ".1f", " GiB")]
        out.append(line)
    return headers, out


def print_summary(runs: Sequence[str | os.PathLike] | list[dict], *, target_loss: float | None = None,
                  console=None) -> None:
    """Print the summary table with rich; accepts run dirs or rows from ``summary_table``."""
    from rich.console import Console

    rows = runs if runs and isinstance(runs[0], dict) else summary_table(runs, target_loss=target_loss)
    headers, lines = format_rows(rows)
    console = console or Console()
    _print_table(console, "speedgpt run summary", headers, lines)
    if note := target_note(rows):
        console.print(note, markup=False, highlight=False)
