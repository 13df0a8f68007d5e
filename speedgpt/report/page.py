"""Writing a report: ``report.png`` and a self-contained ``report.html`` (the PNG embedded as
base64, the summary and A/B tables as HTML, each run's config.toml folded in)."""

from __future__ import annotations

import base64
import datetime as _dt
import html
import os
from pathlib import Path
from typing import Any, Sequence

from ..atomic import atomic_file, atomic_write
from ..rundir import COMPARE_DIR, REPORT_HTML, REPORT_PNG, RunDir
from .compare import compare_runs, comparison_markdown, format_comparison, print_comparison
from .plot import plot_runs
from .runs import RunData, load_runs
from .summary import format_rows, print_summary, sft_notes, summarize, target_note
from .tables import _print_table
from .tokenizers import tokenizer_table


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
        f"<pre>{esc(run.config_text or ('(config.toml empty)' if run.config_unreadable else '(no config.toml)'))}"
        f"</pre></details>\n"
        for run in runs
    )
    notes = [n for n in [target_note(rows), *sft_notes(runs)] if n]
    method = "".join(f"<p class='meta'>{esc(n)}</p>\n" for n in notes)
    tok_table = tokenizer_table(runs)
    tokenizers = f"<h2>tokenizer</h2>\n{_html_table(*tok_table)}" if tok_table else ""
    stamp = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    img = base64.b64encode(png_bytes).decode("ascii")
    return (
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{_CSS}</style></head><body>\n<h1>{esc(title)}</h1>\n"
        f"<p class='meta'>generated {esc(stamp)}</p>\n"
        f"{_html_table(*format_rows(rows))}{method}{tokenizers}{ab}"
        f"<img alt='training curves' src='data:image/png;base64,{img}'>\n"
        f"<h2>configs</h2>\n{configs}</body></html>\n"
    )


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
    # A report being rewritten while someone opens it is never seen half-written.
    with atomic_file(png) as f:
        plot_runs(runs, f, target_loss=target_loss, title=title, rows=rows, comparison=comparison)
    atomic_write(page, _html(runs, rows, png.read_bytes(), title, comparison))
    return {"png": png, "html": page}


def report_runs(run_dirs: Sequence[str | os.PathLike], out: str | os.PathLike | None = None, *,
                target_loss: float | None = None, title: str | None = None, markdown: bool = False) -> dict[str, Path]:
    """`speedgpt report`: write the report files (into `out`; default the run dir for one run,
    FIRST_RUN_DIR/compare for several) and print the summary and A/B tables, or with `markdown`
    only print the A/B table as GitHub markdown on stdout and write no files."""
    # Several runs: the comparison goes next to the baseline's files, never into the working directory.
    default = Path(run_dirs[0]) if len(run_dirs) == 1 else Path(run_dirs[0]) / COMPARE_DIR
    if out is not None and not markdown and RunDir(out).is_run() and \
            Path(out).resolve() not in {Path(d).resolve() for d in run_dirs}:
        # That run's own report.png and report.html (the trainer's) would be replaced by these runs'.
        raise ValueError(f"--out {out} holds another run (its config.toml), whose report this would replace; pass a "
                         f"new directory, or leave --out out ({default})")
    out = Path(out) if out is not None else default
    runs = load_runs(run_dirs)
    rows = [summarize(run, target_loss) for run in runs]
    comparison = compare_runs(runs) if len(runs) > 1 else None
    if markdown:  # stdout holds just the table, ready to redirect into a file
        print(comparison_markdown(comparison), end="")
        return {}
    paths = _render(runs, rows, out, target_loss, title, comparison)
    wrote = f"wrote {paths['png']} and {paths['html']}"
    print_summary(rows)
    for line in sft_notes(runs):
        print(line)
    tok_table = tokenizer_table(runs)
    if tok_table:
        from rich.console import Console

        _print_table(Console(), "tokenizer", *tok_table)
    if comparison is not None:
        print_comparison(comparison)
    print(wrote)
    return paths
