"""The report's figure: loss, val loss against tokens and time, lr, throughput, and a summary panel.

matplotlib is imported inside the plotting function and used through ``Figure`` + the Agg canvas
rather than pyplot: no global backend switch, no figure registry to leak from a long-lived process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..rundir.metrics import finite
from .runs import RunData
from .summary import format_rows, summarize
from .tables import transpose_rows




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
    from matplotlib.ticker import EngFormatter

    # Mixture-of-Experts runs log each MoE layer's load balance: a third row shows it.
    moe = any(isinstance(r.get("moe_max_load"), list) for run in runs for r in run.train)
    fig = Figure(figsize=(16, 13 if moe else 9), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(3 if moe else 2, 3)
    ax_loss, ax_tok, ax_time = axes[0]
    ax_lr, ax_tps, ax_table = axes[1]
    if moe:
        _expert_load_panel(axes[2][0], runs)
        for ax in axes[2][1:]:
            ax.set_axis_off()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    all_times = [r["time_s"] for run in runs for r in run.records if finite(r.get("time_s"))]
    t_div, t_unit = _time_unit(max(all_times, default=0.0))
    _draw_curves(runs, colors, (ax_loss, ax_tok, ax_time, ax_lr, ax_tps), t_div)

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
    _style_axes((ax_loss, ax_tok, ax_time, ax_lr, ax_tps), target_loss)
    _legends(fig, ax_loss, runs, colors)
    fig.suptitle(title or "speedgpt report", fontsize=14, fontweight="bold")

    _table_panel(ax_table, rows or [summarize(r, target_loss) for r in runs], colors, target_loss)
    fig.savefig(png_path, format="png")  # a path or a binary file
    return png_path


def _expert_load_panel(ax, runs: list[RunData]) -> None:
    """The busiest expert's load over the mean (1 = balanced), per MoE layer, against the step."""
    styles = ["-", "--", ":", "-."]
    for i, run in enumerate(runs):
        rows = [r for r in run.train if isinstance(r.get("moe_max_load"), list) and finite(r.get("step"))]
        layers = max((len(r["moe_max_load"]) for r in rows), default=0)
        for layer in range(layers):
            pts = [(r["step"], r["moe_max_load"][layer]) for r in rows if len(r["moe_max_load"]) > layer]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=f"C{i % 10}", ls=styles[layer % 4], lw=1.2,
                    label=f"{run.label}: MoE layer {layer}" if len(runs) > 1 else f"MoE layer {layer}")
    ax.axhline(1.0, color="0.3", lw=0.9, ls=":")
    ax.set(title="expert load: busiest expert / mean, per MoE layer", xlabel="step", ylabel="max / mean load")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")


def _series(rows: list[dict], xkey: str, ykey: str) -> tuple[list, list]:
    pts = [(r[xkey], r[ykey]) for r in rows if finite(r.get(xkey)) and finite(r.get(ykey))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _marker(n: int):  # a lone point needs a marker to be visible at all
    return "o" if n <= 40 else None


def _noisy_curve(ax, xs, ys, c) -> None:
    # Per-step train loss and throughput jitter: draw them faint, with the smoothed line on top.
    if len(xs) >= _SMOOTH_MIN_POINTS:
        ax.plot(xs, ys, color=c, alpha=0.2, lw=0.7)
        ax.plot(xs, _ema(ys, len(ys) / 40), color=c, lw=1.4)
    else:
        ax.plot(xs, ys, color=c, lw=1.4, marker=_marker(len(xs)), ms=3)


def _draw_curves(runs: list[RunData], colors: list[str], axes, t_div: float) -> None:
    ax_loss, ax_tok, ax_time, ax_lr, ax_tps = axes
    for run, c in zip(runs, colors):
        _noisy_curve(ax_loss, *_series(run.train, "step", "train_loss"), c)
        xs, ys = _series(run.evals, "step", "val_loss")
        ax_loss.plot(xs, ys, color=c, lw=1.2, ls="--", marker=_marker(len(xs)) or ".", ms=4)
        for ax, xkey, div in ((ax_tok, "tokens", 1.0), (ax_time, "time_s", t_div)):
            xs, ys = _series(run.evals, xkey, "val_loss")
            ax.plot([x / div for x in xs], ys, color=c, lw=1.5, marker=_marker(len(xs)), ms=4)
        xs, ys = _series(run.train, "step", "lr")
        ax_lr.plot(xs, ys, color=c, lw=1.5, marker=_marker(len(xs)), ms=3)
        _noisy_curve(ax_tps, *_series(run.train, "step", "tok_per_s"), c)


def _style_axes(axes, target_loss: float | None) -> None:
    """Log y for wide loss ranges, the target line, grids, and a word on each empty panel."""
    ax_loss, ax_tok, ax_time, ax_lr, ax_tps = axes
    empty = {ax for ax in axes if not _has_points(ax)}
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
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
        ax.grid(True, which="minor", alpha=0.1)
        if ax in empty:
            # Empty axes would show meaningless default ticks (-0.04..0.04): say why it is empty.
            ax.set_xticks([])
            ax.set_yticks([])
            why = "no val_loss lines in metrics.jsonl" if ax in (ax_tok, ax_time) else "not logged"
            ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="0.4")


def _legends(fig, ax_loss, runs: list[RunData], colors: list[str]) -> None:
    from matplotlib.lines import Line2D

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
