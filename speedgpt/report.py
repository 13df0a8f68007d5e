"""Run reports: curves and a summary table for one run or several overlaid.

``write_report([run_dir], out_dir)`` writes ``report.png`` and a self-contained ``report.html``
(the PNG embedded as base64, the summary as an HTML table, each run's config.toml folded in).
It reads only the run directory contract (config.toml, metrics.jsonl), so it works on finished,
crashed and still-running runs alike, and on runs from older versions of the trainer.

With several runs the first is the baseline A of an A/B table (``compare_runs``): each run's val
loss at equal training time and at equal tokens, its delta to A, the final numbers, and the config
keys that differ from A's; printed with rich, as GitHub markdown (``--markdown``) and in the HTML.

matplotlib is imported inside the plotting function and used through ``Figure`` + the Agg canvas
rather than pyplot: no global backend switch, no figure registry to leak from a long-lived trainer.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import html
import os
import statistics
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from speedgpt.train.metrics import finite, read_metrics

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport (a declared dependency there)
    import tomli as tomllib

REPORT_PNG = "report.png"
REPORT_HTML = "report.html"


# ----------------------------------------------------------------------------------------------
# Loading


@dataclass
class RunData:
    dir: Path
    label: str
    config: dict = field(default_factory=dict)
    config_text: str = ""
    records: list[dict] = field(default_factory=list)

    @property
    def train(self) -> list[dict]:
        return [r for r in self.records if finite(r.get("train_loss"))]

    @property
    def evals(self) -> list[dict]:
        return [r for r in self.records if finite(r.get("val_loss"))]


def load_run(run_dir: str | os.PathLike) -> RunData:
    """Read one run dir; a missing metrics.jsonl is an error, a missing/bad config.toml is not
    (the label then falls back to the directory name)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    config, text = {}, ""
    cfg_path = run_dir / "config.toml"
    if cfg_path.is_file():
        text = cfg_path.read_text(encoding="utf-8")
        try:
            config = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            warnings.warn(f"{cfg_path}: unreadable TOML ({e}); labelling the run by its directory name")
    name = (config.get("run") or {}).get("name")
    label = str(name) if name else (run_dir.resolve().name or str(run_dir))
    return RunData(dir=run_dir, label=label, config=config, config_text=text, records=records)


def load_runs(run_dirs: Sequence[str | os.PathLike]) -> list[RunData]:
    if not run_dirs:
        raise ValueError("no run directories given: pass at least one RUN_DIR")
    runs = [load_run(d) for d in run_dirs]
    # Two runs with the same name (e.g. the same preset twice) need distinct legend entries.
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    for run in runs:
        if seen[run.label] > 1:
            run.label = f"{run.label} ({run.dir})"
    return runs


# ----------------------------------------------------------------------------------------------
# Summary


def summarize(run: RunData, target_loss: float | None = None) -> dict[str, Any]:
    """One summary row; a value is None when the run did not log what it needs."""
    recs, train, evals = run.records, run.train, run.evals

    def col(rows, key):
        return [r[key] for r in rows if finite(r.get(key))]

    def median(values):
        return statistics.median(values) if values else None

    best = min(evals, key=lambda r: r["val_loss"], default=None)
    reached = None
    if target_loss is not None:
        # First eval at or below target, in step order: the speedrun's "time to target".
        reached = next((r for r in evals if r["val_loss"] <= target_loss), None)
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
        "target_reached": reached is not None,
        "time_to_target_s": reached.get("time_s") if reached else None,
        "tokens_to_target": reached.get("tokens") if reached else None,
        "steps_to_target": reached["step"] if reached else None,
        "median_tok_per_s": median(col(train, "tok_per_s")),
        "median_mfu": median(col(train, "mfu")),
        "peak_mem_gib": max(col(recs, "peak_mem_gib"), default=None),
    }


def summary_table(run_dirs: Sequence[str | os.PathLike], *, target_loss: float | None = None) -> list[dict]:
    """Summary rows (dicts of raw numbers, see ``summarize``), one per run dir."""
    return [summarize(run, target_loss) for run in load_runs(run_dirs)]


def fmt_count(n: float | None) -> str:
    if n is None:
        return "–"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.3g}" if isinstance(n, float) else str(n)


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m {s % 60:04.1f}s"
    return f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def format_rows(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Headers and display strings shared by the HTML, rich and PNG renderings."""
    target = next((r["target_loss"] for r in rows if r.get("target_loss") is not None), None)
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


def transpose_rows(headers: list[str], lines: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Metrics as rows, runs as columns (the first header is the run name)."""
    return [""] + [line[0] for line in lines], [[h] + [line[i] for line in lines] for i, h in enumerate(headers) if i]


def print_summary(runs: Sequence[str | os.PathLike] | list[dict], *, target_loss: float | None = None,
                  console=None) -> None:
    """Print the summary table with rich; accepts run dirs or rows from ``summary_table``."""
    from rich.console import Console

    rows = runs if runs and isinstance(runs[0], dict) else summary_table(runs, target_loss=target_loss)
    headers, lines = format_rows(rows)
    _print_table(console or Console(), "speedgpt run summary", headers, lines)


# ----------------------------------------------------------------------------------------------
# A/B comparison: is run B better than baseline A at equal training time, and at equal tokens?
#
# The project keeps a recipe change only if its run reaches a lower validation loss than the
# baseline's at equal training time. Runs never end at exactly the same time, so each run's val
# curve is read at a common point: T = the earliest last validation among the runs, in `time_s`
# (the trainer's training time, which leaves out compile/warmup, evaluation and checkpoint
# writes), and likewise N tokens. Values are interpolated linearly between val records, never
# extrapolated. With an lr schedule that cools down at the end of the run, a longer run read at T
# is a model in mid-cooldown set against a finished one: those cells carry a "*" and a note, and
# the plain final numbers stand beside them.

# A run read more than this fraction before its own last val point counts as read mid-run.
MID_RUN_TOL = 0.01
# Identity, not recipe: these differ between any two runs and label nothing.
_NOT_RECIPE = frozenset({"run.name", "run.dir"})
# Records that `speedgpt eval` appended (its own data/token count), not the trainer's validation.
_POSTHOC_EVAL_KEYS = ("eval_tokens", "eval_data")


def val_curve(run: RunData, xkey: str) -> list[tuple[float, float]]:
    """``(x, val_loss)`` of the run's val records in step order, x being ``time_s`` or ``tokens``."""
    return [(float(r[xkey]), float(r["val_loss"])) for r in run.evals if finite(r.get(xkey))]


def interpolate(curve: Sequence[tuple[float, float]], x: float | None) -> float | None:
    """The curve's value at ``x``, linear between neighbouring points; None for fewer than two
    points or an ``x`` outside the curve (no extrapolation). Of two points at one x, the later wins."""
    if x is None or len(curve) < 2:
        return None
    pts = sorted(curve, key=lambda p: p[0])  # stable: points at one x stay in step order
    exact = [y for px, y in pts if px == x]
    if exact:
        return exact[-1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 < x < x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None  # outside the curve


def resolved_config(run: RunData) -> dict[str, Any] | None:
    """The run's config as ``{"section.key": value}`` (top-level keys as themselves); None without a
    readable config.toml. Keys the file lacks take the defaults a rerun from that file would get; a
    file from another speedgpt version (unknown keys) is taken as written."""
    if not run.config:
        return None
    from speedgpt.config import config_from_dict

    try:
        data = config_from_dict(run.config).to_dict()
    except (ValueError, TypeError):  # ConfigError is a ValueError
        data = run.config
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def _override_value(v: Any) -> str:
    """A value as a `--section.key=value` override would spell it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v and v.strip() == v else f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(f'"{x}"' if isinstance(x, str) else _override_value(x) for x in v) + "]"
    return repr(v) if isinstance(v, float) else str(v)


def config_diff(base: dict[str, Any] | None, other: dict[str, Any] | None) -> list[str] | None:
    """``section.key=value`` for each resolved key whose value in ``other`` differs from ``base``
    (run.name and run.dir left out); None when either config is unknown."""
    if base is None or other is None:
        return None
    keys = list(other) + [k for k in base if k not in other]
    return [f"{k}={_override_value(other[k]) if k in other else '(unset)'}"
            for k in keys if k not in _NOT_RECIPE and (k not in base or k not in other or base[k] != other[k])]


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else str(i + 1)


def _schedule_words(cfg: dict[str, Any] | None) -> str:
    if not cfg:
        return "schedule unknown"
    kind = cfg.get("schedule.kind", "?")
    if kind == "warmup_cosine":
        return "warmup_cosine"
    return f"{kind}, cooldown over the last {100 * float(cfg.get('schedule.cooldown_frac', 0)):g}% of steps"


def compare_runs(runs: Sequence[RunData]) -> dict[str, Any]:
    """The A/B table: ``runs[0]`` is the baseline A. Returns ``{"equal_time_s", "equal_tokens",
    "rows", "notes"}``; each row holds raw numbers (None where a run cannot give one):
    ``final_val_loss``, ``delta_final``, ``train_time_s``, ``tokens``, ``mean_tok_per_s`` (tokens over
    training time), ``val_at_equal_time``, ``delta_at_equal_time``, ``val_at_equal_tokens``,
    ``delta_at_equal_tokens`` (deltas are run minus baseline: negative = better than A), the
    ``mid_run_*`` flags and ``overrides`` (the config keys that differ from A's)."""
    if len(runs) < 2:
        raise ValueError("an A/B comparison needs at least two runs: the baseline A first, then the variants")
    axes = {"time": "time_s", "tokens": "tokens"}
    curves = {ax: [val_curve(run, key) for run in runs] for ax, key in axes.items()}
    # The common point: the earliest end among the runs that have a curve (two val points or more).
    at = {ax: min((c[-1][0] for c in cs if len(c) >= 2), default=None) for ax, cs in curves.items()}
    configs = [resolved_config(run) for run in runs]
    rows: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        evals = run.evals
        timed = [r for r in run.records if finite(r.get("tokens")) and finite(r.get("time_s"))]
        last = timed[-1] if timed else None
        row: dict[str, Any] = {
            "id": _letter(i), "run": run.label, "dir": str(run.dir), "baseline": i == 0,
            "overrides": [] if i == 0 else config_diff(configs[0], configs[i]),
            "has_config": configs[i] is not None,
            "val_points": len(evals),
            "final_val_loss": evals[-1]["val_loss"] if evals else None,
            "train_time_s": max((r["time_s"] for r in timed), default=None),
            "tokens": max((r["tokens"] for r in timed), default=None),
            "mean_tok_per_s": last["tokens"] / last["time_s"] if last and last["time_s"] > 0 else None,
            "posthoc_eval": any(k in r for r in evals for k in _POSTHOC_EVAL_KEYS),
        }
        for ax in axes:
            curve = curves[ax][i]
            value = interpolate(curve, at[ax])
            row[f"val_at_equal_{ax}"] = value
            row[f"mid_run_{ax}"] = value is not None and at[ax] < curve[-1][0] * (1 - MID_RUN_TOL)
        rows.append(row)
    base = rows[0]
    for row in rows:
        for key in ("final", "equal_time", "equal_tokens"):
            src = "final_val_loss" if key == "final" else f"val_at_{key}"
            a, b = base[src], row[src]
            row["delta_final" if key == "final" else f"delta_at_{key}"] = None if a is None or b is None else b - a
    return {"equal_time_s": at["time"], "equal_tokens": at["tokens"], "rows": rows,
            "notes": _comparison_notes(rows, at, configs)}


def _comparison_notes(rows: list[dict], at: dict[str, float | None], configs: list) -> list[str]:
    notes = []
    if at["time"] is not None:
        notes.append(f"equal time {fmt_duration(at['time'])}, equal tokens {fmt_count(at['tokens'])}: the earliest "
                     "last validation among the runs; val loss linear in training time (excl. compile, eval, "
                     "checkpoints) or in tokens, never extrapolated; Δ = run − A, negative is better.")
    mid = [(r, cfg) for r, cfg in zip(rows, configs) if r["mid_run_time"] or r["mid_run_tokens"]]
    if mid:
        who = "; ".join(f"{r['id']} ({_schedule_words(cfg)})" for r, cfg in mid)
        notes.append(f"* read mid-run, before the lr decay ended: {who}. A model not yet cooled down against a "
                     "finished one favours the shorter run: decide on final val of runs trained for equal time.")
    short = [r["id"] for r in rows if r["val_points"] < 2]
    if short:
        notes.append(f"– at equal time/tokens: {', '.join(short)} logged fewer than two val records, "
                     "no curve to read.")
    posthoc = [r["id"] for r in rows if r["posthoc_eval"]]
    if posthoc:
        notes.append(f"val records of {', '.join(posthoc)} include `speedgpt eval` results (their own data and "
                     "token count): compare them only with evals of the same data.")
    return notes


def _fmt_delta(x: float | None) -> str:
    return "–" if x is None else f"{x:+.4f}"


def format_comparison(comp: dict[str, Any], *, markdown: bool = False) -> tuple[list[str], list[list[str]]]:
    """Headers and display strings of the A/B table (``compare_runs`` output). A "*" marks a value
    read mid-run, and a delta whose run or baseline was (see the notes)."""
    headers = ["run", "overrides vs A", "final val", "Δ final", "train time", "tok/s (mean)",
               f"val @ equal time ({fmt_duration(comp['equal_time_s'])})", "Δ vs A @ equal time",
               f"val @ equal tokens ({fmt_count(comp['equal_tokens'])})", "Δ vs A @ equal tokens"]
    code = (lambda s: f"`{s}`") if markdown else (lambda s: s)
    mark = "\\*" if markdown else "*"  # a bare "*" could start emphasis in markdown
    base = comp["rows"][0]
    lines = []
    for r in comp["rows"]:
        if r["baseline"]:
            overrides = "(baseline)"
        elif not r["has_config"]:
            overrides = "– (no config.toml)"
        elif r["overrides"] is None:
            overrides = "– (A has no config.toml)"
        else:
            overrides = ", ".join(code(o) for o in r["overrides"]) or "(same config)"
        cells = [f"{r['id']}: {r['run']}", overrides, _fmt(r["final_val_loss"], ".4f"), _fmt_delta(r["delta_final"]),
                 fmt_duration(r["train_time_s"]), _fmt(r["mean_tok_per_s"], ",.0f")]
        for ax in ("time", "tokens"):
            value, delta = r[f"val_at_equal_{ax}"], r[f"delta_at_equal_{ax}"]
            mid, base_mid = r[f"mid_run_{ax}"], base[f"mid_run_{ax}"]
            biased = delta is not None and not r["baseline"] and (mid or base_mid)
            cells += [_fmt(value, ".4f") + (mark if mid else ""), _fmt_delta(delta) + (mark if biased else "")]
        lines.append(cells)
    return headers, lines


def comparison_markdown(comp: dict[str, Any]) -> str:
    """The A/B table as GitHub markdown (paste into docs/benchmarks.md), notes as a list below it."""
    headers, lines = format_comparison(comp, markdown=True)

    def row(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    out = [row(headers), "|" + "|".join(["---"] * 2 + ["---:"] * (len(headers) - 2)) + "|"]
    out += [row(line) for line in lines]
    if comp["notes"]:
        out += [""] + ["- " + ("\\" + n if n.startswith("*") else n) for n in comp["notes"]]
    return "\n".join(out) + "\n"


def print_comparison(comp: dict[str, Any], *, console=None) -> None:
    """Print the A/B table with rich, notes below it."""
    from rich.console import Console

    console = console or Console()
    headers, lines = format_comparison(comp)
    _print_table(console, "A/B against baseline A (Δ < 0: better)", headers, lines, wrap=True, text_columns=2)
    for note in comp["notes"]:
        console.print(note, markup=False, highlight=False)


def _print_table(console, title: str, headers: list[str], lines: list[list[str]], *, wrap: bool = False,
                 text_columns: int = 1) -> None:
    """One row per run where the terminal is wide enough, else one column per run (rather than
    letting rich squeeze every cell to "…"). ``wrap``: cells may wrap (long override lists);
    the first ``text_columns`` columns are text (left-aligned), the rest numbers."""
    from rich.table import Table
    from rich.text import Text

    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    if sum(widths) + 3 * len(widths) + 1 > console.width:
        headers, lines = transpose_rows(headers, lines)
        text_columns = 1
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i < text_columns else "right", no_wrap=i > 0 and not wrap,
                         overflow="fold" if wrap else "ellipsis")  # fold: a long override is split, not cut
    for line in lines:
        table.add_row(*(Text(c) for c in line))  # Text: a "[...]" in a label or value is not markup
    console.print(table)


# ----------------------------------------------------------------------------------------------
# Plot


def _ema(values: list[float], span: float) -> list[float]:
    """Bias-corrected exponential moving average (reads like TensorBoard's smoothing)."""
    beta = 1.0 - 1.0 / max(span, 1.0)
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**i))
    return out


# Below this many points a curve is drawn as logged; above, raw (faint) + EMA (span n/40).
_SMOOTH_MIN_POINTS = 100


def _time_unit(max_s: float) -> tuple[float, str]:
    if max_s >= 2 * 3600:
        return 3600.0, "h"
    if max_s >= 120:
        return 60.0, "min"
    return 1.0, "s"


def plot_runs(runs: list[RunData], png_path: Path, *, target_loss: float | None = None,
              title: str | None = None, rows: list[dict] | None = None,
              comparison: dict[str, Any] | None = None) -> Path:
    """Draw the 2x3 panel figure to ``png_path`` (rows: precomputed ``summarize`` output;
    comparison: ``compare_runs`` output, whose equal-time/-token points are marked)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import EngFormatter

    fig = Figure(figsize=(16, 9), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    ax_loss, ax_tok, ax_time = axes[0]
    ax_lr, ax_tps, ax_table = axes[1]
    colors = [f"C{i % 10}" for i in range(len(runs))]
    all_times = [r["time_s"] for run in runs for r in run.records if finite(r.get("time_s"))]
    t_div, t_unit = _time_unit(max(all_times, default=0.0))

    def series(rows, xkey, ykey):
        pts = [(r[xkey], r[ykey]) for r in rows if finite(r.get(xkey)) and finite(r.get(ykey))]
        return [p[0] for p in pts], [p[1] for p in pts]

    def marker(n):  # a lone point needs a marker to be visible at all
        return "o" if n <= 40 else None

    def noisy_curve(ax, xs, ys, c):
        # Per-step train loss and throughput jitter: draw them faint, with the smoothed line on top.
        if len(xs) >= _SMOOTH_MIN_POINTS:
            ax.plot(xs, ys, color=c, alpha=0.2, lw=0.7)
            ax.plot(xs, _ema(ys, len(ys) / 40), color=c, lw=1.4)
        else:
            ax.plot(xs, ys, color=c, lw=1.4, marker=marker(len(xs)), ms=3)

    for run, c in zip(runs, colors):
        noisy_curve(ax_loss, *series(run.train, "step", "train_loss"), c)
        xs, ys = series(run.evals, "step", "val_loss")
        ax_loss.plot(xs, ys, color=c, lw=1.2, ls="--", marker=marker(len(xs)) or ".", ms=4)
        for ax, xkey, div in ((ax_tok, "tokens", 1.0), (ax_time, "time_s", t_div)):
            xs, ys = series(run.evals, xkey, "val_loss")
            ax.plot([x / div for x in xs], ys, color=c, lw=1.5, marker=marker(len(xs)), ms=4)
        xs, ys = series(run.train, "step", "lr")
        ax_lr.plot(xs, ys, color=c, lw=1.5, marker=marker(len(xs)), ms=3)
        noisy_curve(ax_tps, *series(run.train, "step", "tok_per_s"), c)

    ax_loss.set(title="loss vs step", xlabel="step", ylabel="loss (nats/token)")
    ax_tok.set(title="val loss vs tokens", xlabel="tokens", ylabel="val loss")
    ax_time.set(title="val loss vs training time", xlabel=f"wall time ({t_unit}, excl. compile)", ylabel="val loss")
    ax_lr.set(title="learning rate vs step", xlabel="step", ylabel="lr")
    ax_tps.set(title="throughput vs step", xlabel="step", ylabel="tokens / s")
    ax_tok.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax_tps.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax_tps.set_ylim(bottom=0)

    if comparison is not None:
        # Where the A/B table reads every curve: the earliest last validation among the runs.
        t_equal = comparison["equal_time_s"]
        for ax, x, what in ((ax_tok, comparison["equal_tokens"], "equal tokens"),
                            (ax_time, None if t_equal is None else t_equal / t_div, "equal time")):
            if x is not None and _has_points(ax):
                ax.axvline(x, color="0.4", lw=0.9, ls=":")
                ax.annotate(what, xy=(x, 1), xycoords=("data", "axes fraction"), xytext=(-3, -3),
                            textcoords="offset points", ha="right", va="top", fontsize=8, color="0.3")
    empty = {ax for ax in (ax_loss, ax_tok, ax_time, ax_lr, ax_tps) if not _has_points(ax)}
    for ax in {ax_loss, ax_tok, ax_time} - empty:
        ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
        if ys and max(ys) >= 2 * min(ys):
            # Early loss is ~3x the final one and the tail is what matters: log y shows both.
            # (Over a narrower range log ticks are sparse and a linear axis reads better.)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(_plain_log_formatter())
            ax.yaxis.set_minor_formatter(_plain_log_formatter(minor=True))
        if target_loss is not None:
            ax.axhline(target_loss, color="0.3", lw=0.9, ls=":")
            # Label at the left: curves start high there, so the text never sits on a curve.
            ax.annotate(f"target {target_loss:g}", xy=(0, target_loss), xycoords=("axes fraction", "data"),
                        xytext=(4, 3), textcoords="offset points", ha="left", va="bottom", fontsize=8, color="0.3")
    for ax in (ax_loss, ax_tok, ax_time, ax_lr, ax_tps):
        ax.grid(True, which="major", alpha=0.3)
        ax.grid(True, which="minor", alpha=0.1)
        if ax in empty:
            # Empty axes would show meaningless default ticks (-0.04..0.04): say why it is empty.
            ax.set_xticks([])
            ax.set_yticks([])
            why = "no val_loss lines in metrics.jsonl" if ax in (ax_tok, ax_time) else "not logged"
            ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="0.4")

    style = []
    if any(len(run.train) >= _SMOOTH_MIN_POINTS for run in runs):
        style += [Line2D([], [], color="0.2", lw=1.4, label="train (smoothed)"),
                  Line2D([], [], color="0.2", lw=0.7, alpha=0.3, label="train (raw)")]
    elif any(run.train for run in runs):
        style += [Line2D([], [], color="0.2", lw=1.4, label="train")]
    if any(run.evals for run in runs):
        style += [Line2D([], [], color="0.2", lw=1.2, ls="--", marker=".", label="val")]
    if style:
        ax_loss.legend(handles=style, loc="upper right", fontsize=8)
    run_handles = [Line2D([], [], color=c, lw=2.5, label=run.label) for run, c in zip(runs, colors)]
    fig.legend(handles=run_handles, loc="outside lower center", ncol=min(len(runs), 4), fontsize=10, frameon=False)
    fig.suptitle(title or "speedgpt report", fontsize=14, fontweight="bold")

    _table_panel(ax_table, rows or [summarize(r, target_loss) for r in runs], colors, target_loss)
    png_path = Path(png_path)
    fig.savefig(png_path)
    return png_path


def _has_points(ax) -> bool:
    return any(len(line.get_xdata()) for line in ax.get_lines())


def _plain_log_formatter(minor: bool = False):
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        # Losses live within one decade (2.5..11): print 3, 4, 6 rather than 3×10⁰.
        def __call__(self, x, pos=None):
            if minor and not any(abs(x - v) < 1e-9 for v in (2, 3, 4, 5, 6, 8)):
                return ""
            return f"{x:g}"

    return Plain(labelOnlyBase=False)


def _table_panel(ax, rows: list[dict], colors: list[str], target_loss: float | None) -> None:
    """A compact summary in the PNG so the image stands alone (the HTML has the full table).
    Few runs: one column per run with every metric; many runs: one row per run, key metrics."""
    ax.axis("off")
    headers, lines = format_rows(rows)
    for line in lines:  # long labels would overflow the cell; the figure legend has them in full
        line[0] = line[0] if len(line[0]) <= 22 else line[0][:21] + "…"
    transposed = len(rows) <= 3
    if transposed:
        headers, lines = transpose_rows(headers, lines)
    else:
        keep = [0, 1, 4, 5] + ([6] if target_loss is not None else [])  # fits the panel's width
        headers, lines = [headers[i] for i in keep], [[line[i] for i in keep] for line in lines]
    table = ax.table(cellText=lines, colLabels=headers, loc="upper center", cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1.0, 1.45)
    table.auto_set_column_width(list(range(len(headers))))
    for (row, col), cell in table.get_celld().items():
        cell.set_edgecolor("0.8")
        if row == 0:
            cell.set_text_props(fontweight="bold")
            if transposed and col > 0:
                cell.get_text().set_color(colors[col - 1])
        elif col == 0:
            cell.get_text().set_color("0.25" if transposed else colors[row - 1])
    ax.set_title("summary", fontsize=11)


# ----------------------------------------------------------------------------------------------
# HTML + entry points


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1700px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; } pre { background: #f7f7f7; padding: 8px; overflow-x: auto; }
.meta { color: #666; font-size: 13px; }
"""


def _html_table(headers: list[str], lines: list[list[str]]) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in line) + "</tr>\n" for line in lines)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>\n"


def _html(runs: list[RunData], rows: list[dict], png_bytes: bytes, title: str,
          comparison: dict[str, Any] | None = None) -> str:
    esc = html.escape
    ab = ""
    if comparison is not None:
        notes = "".join(f"<p class='meta'>{esc(n)}</p>\n" for n in comparison["notes"])
        ab = f"<h2>A/B: equal training time and equal tokens</h2>\n{_html_table(*format_comparison(comparison))}{notes}"
    configs = "".join(
        f"<details><summary>{esc(run.label)} — {esc(str(run.dir))}</summary>"
        f"<pre>{esc(run.config_text or '(no config.toml)')}</pre></details>\n"
        for run in runs
    )
    stamp = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    img = base64.b64encode(png_bytes).decode("ascii")
    return (
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{_CSS}</style></head><body>\n<h1>{esc(title)}</h1>\n"
        f"<p class='meta'>generated {esc(stamp)}</p>\n"
        f"{_html_table(*format_rows(rows))}{ab}"
        f"<img alt='training curves' src='data:image/png;base64,{img}'>\n"
        f"<h2>configs</h2>\n{configs}</body></html>\n"
    )


def _atomic_write(path: Path, data: bytes) -> None:
    # A report being rewritten while someone opens it should never be seen half-written.
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(run_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
                 target_loss: float | None = None, title: str | None = None) -> dict[str, Path]:
    """Write ``out_dir/report.png`` and ``out_dir/report.html`` (with the A/B table when there are
    several runs, the first being the baseline); returns ``{"png": ..., "html": ...}``."""
    runs = load_runs(run_dirs)
    comparison = compare_runs(runs) if len(runs) > 1 else None
    return _render(runs, [summarize(run, target_loss) for run in runs], Path(out_dir), target_loss, title, comparison)


def _render(runs: list[RunData], rows: list[dict], out_dir: Path, target_loss: float | None,
            title: str | None, comparison: dict[str, Any] | None = None) -> dict[str, Path]:
    title = title or (f"speedgpt report: {runs[0].label}" if len(runs) == 1 else f"speedgpt report: {len(runs)} runs")
    out_dir.mkdir(parents=True, exist_ok=True)
    png, page = out_dir / REPORT_PNG, out_dir / REPORT_HTML
    tmp_png = out_dir / f".{REPORT_PNG}.tmp{os.getpid()}.png"
    plot_runs(runs, tmp_png, target_loss=target_loss, title=title, rows=rows, comparison=comparison)
    os.replace(tmp_png, png)
    _atomic_write(page, _html(runs, rows, png.read_bytes(), title, comparison).encode("utf-8"))
    return {"png": png, "html": page}


def main(argv: Sequence[str] | None = None) -> int:
    """``speedgpt report RUN_DIR [RUN_DIR...] [--out DIR] [--target-loss X] [--title T] [--markdown]``."""
    p = argparse.ArgumentParser(
        prog="speedgpt report", description="Plot and summarize one or more runs. With several, the first is the "
        "baseline A of an A/B table: val loss at equal training time and at equal tokens, and the config keys "
        "that differ from A's.")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                   help="run directories written by `speedgpt train`; with several, the first is the baseline A")
    p.add_argument("--out", type=Path, default=None,
                   help="output dir for report.png/html (default: the run dir for one run, "
                        "FIRST_RUN_DIR/compare for several)")
    p.add_argument("--target-loss", type=float, default=None, help="report time/tokens to reach this val loss")
    p.add_argument("--title", default=None, help="plot and page title (default: speedgpt report)")
    p.add_argument("--markdown", action="store_true",
                   help="print only the A/B table, as GitHub markdown (for docs/benchmarks.md), and write no "
                        "files; needs 2+ runs")
    args = p.parse_args(argv)
    if args.markdown and len(args.run_dirs) < 2:
        p.error("--markdown prints the A/B table: pass the baseline RUN_DIR first, then one or more variants")
    # Several runs: the comparison goes next to the baseline's files, never into the working directory.
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else args.run_dirs[0] / "compare")
    runs = load_runs(args.run_dirs)
    rows = [summarize(run, args.target_loss) for run in runs]
    comparison = compare_runs(runs) if len(runs) > 1 else None
    if args.markdown:  # stdout holds just the table, ready to redirect into a file
        print(comparison_markdown(comparison), end="")
        return 0
    paths = _render(runs, rows, out, args.target_loss, args.title, comparison)
    wrote = f"wrote {paths['png']} and {paths['html']}"
    print_summary(rows)
    if comparison is not None:
        print_comparison(comparison)
    print(wrote)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
