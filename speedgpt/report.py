"""Run reports: curves and a summary table for one run or several overlaid.

``write_report([run_dir], out_dir)`` writes ``report.png`` and a self-contained ``report.html``
(the PNG embedded as base64, the summary as an HTML table, each run's config.toml folded in).
It reads only the run directory contract (config.toml, metrics.jsonl), so it works on finished,
crashed and still-running runs alike, and on runs from older versions of the trainer.

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
    from rich.table import Table

    rows = runs if runs and isinstance(runs[0], dict) else summary_table(runs, target_loss=target_loss)
    headers, lines = format_rows(rows)
    console = console or Console()
    # One row per run reads best, but an 80-column terminal cannot hold ~11 columns: then show
    # one column per run instead of letting rich squeeze every cell to "…".
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    if sum(widths) + 3 * len(widths) + 1 > console.width:
        headers, lines = transpose_rows(headers, lines)
    table = Table(title="speedgpt run summary")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=i > 0)
    for line in lines:
        table.add_row(*line)
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
              title: str | None = None, rows: list[dict] | None = None) -> Path:
    """Draw the 2x3 panel figure to ``png_path`` (rows: precomputed ``summarize`` output)."""
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


def _html(runs: list[RunData], rows: list[dict], png_bytes: bytes, title: str) -> str:
    headers, lines = format_rows(rows)
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in line) + "</tr>\n" for line in lines)
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
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>\n"
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
    """Write ``out_dir/report.png`` and ``out_dir/report.html``; returns ``{"png": ..., "html": ...}``."""
    runs = load_runs(run_dirs)
    return _render(runs, [summarize(run, target_loss) for run in runs], Path(out_dir), target_loss, title)


def _render(runs: list[RunData], rows: list[dict], out_dir: Path, target_loss: float | None,
            title: str | None) -> dict[str, Path]:
    title = title or (f"speedgpt report: {runs[0].label}" if len(runs) == 1 else f"speedgpt report: {len(runs)} runs")
    out_dir.mkdir(parents=True, exist_ok=True)
    png, page = out_dir / REPORT_PNG, out_dir / REPORT_HTML
    tmp_png = out_dir / f".{REPORT_PNG}.tmp{os.getpid()}.png"
    plot_runs(runs, tmp_png, target_loss=target_loss, title=title, rows=rows)
    os.replace(tmp_png, png)
    _atomic_write(page, _html(runs, rows, png.read_bytes(), title).encode("utf-8"))
    return {"png": png, "html": page}


def main(argv: Sequence[str] | None = None) -> int:
    """``speedgpt report RUN_DIR [RUN_DIR...] [--out DIR] [--target-loss X] [--title T]``."""
    p = argparse.ArgumentParser(prog="speedgpt report", description="Plot and summarize one or more runs.")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, default=None,
                   help="output dir (default: the run dir for one run, ./speedgpt-report for several)")
    p.add_argument("--target-loss", type=float, default=None, help="report time/tokens to reach this val loss")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else Path("speedgpt-report"))
    runs = load_runs(args.run_dirs)
    rows = [summarize(run, args.target_loss) for run in runs]
    paths = _render(runs, rows, out, args.target_loss, args.title)
    print_summary(rows)
    print(f"wrote {paths['png']} and {paths['html']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
