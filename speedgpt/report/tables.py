"""Display strings for report tables, and printing a table with rich that stays readable in a
narrow terminal (rich is imported on use)."""

from __future__ import annotations

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


def transpose_rows(headers: list[str], lines: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Metrics as rows, runs as columns (the first header is the run name)."""
    return [""] + [line[0] for line in lines], [[h] + [line[i] for line in lines] for i, h in enumerate(headers) if i]


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
