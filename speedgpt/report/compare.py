"""The A/B table: each run against baseline A at equal training time and at equal tokens."""

from __future__ import annotations

from typing import Any, Sequence

from ..rundir.metrics import finite
from .runs import RunData
from .tables import _fmt, _print_table, fmt_count, fmt_duration


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
    readable config.toml (one cut short is unreadable: runs.py load_run). Keys the file lacks take the defaults a
    rerun from that file would get; a file from another speedgpt version (unknown keys) is taken as written."""
    if not run.config:
        return None
    from speedgpt.config import config_from_dict, flat_config

    try:
        data = config_from_dict(run.config).to_dict()
    except (ValueError, TypeError):  # ConfigError is a ValueError
        data = run.config
    return flat_config(data)


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


def val_data(cfg: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a run's validation loss was measured on, by config key: the val shards (data.val_files, else those of
    data.train_files, else the local corpus's build), the tokenizer and vocabulary (a loss per token of another
    tokenizer is in other units), how many tokens, in rows of which length. None without a config."""
    if cfg is None:
        return None
    out = {k: cfg.get(k) for k in ("data.val_files", "data.tokenizer", "model.vocab_size", "data.val_tokens")}
    if not cfg.get("data.val_files"):
        out["data.train_files"] = cfg.get("data.train_files")
        if not cfg.get("data.train_files"):  # the default corpus: its size and pieces decide its val files
            out.update({k: cfg.get(k) for k in ("data.local_max_tokens", "data.local_piece_chars")})
    out["data.val_seq_len"] = cfg.get("data.val_seq_len") or cfg.get("data.seq_len")
    return out


def other_val_data(base: dict[str, Any] | None, other: dict[str, Any] | None) -> list[str]:
    """The keys (val_data) in which run `other` validated on something else than baseline `base`; [] when the same
    or unknown."""
    a, b = val_data(base), val_data(other)
    if a is None or b is None:
        return []
    # A key only one side has (the default corpus's build keys) goes with a data.train_files or data.val_files that
    # differs, which says it.
    return [k for k in a if k in b and a[k] != b[k]]


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
            "config_unreadable": run.config_unreadable,
            "val_points": len(evals),
            "final_val_loss": evals[-1]["val_loss"] if evals else None,
            "train_time_s": max((r["time_s"] for r in timed), default=None),
            "tokens": max((r["tokens"] for r in timed), default=None),
            "mean_tok_per_s": last["tokens"] / last["time_s"] if last and last["time_s"] > 0 else None,
            "posthoc_eval": any(k in r for r in evals for k in _POSTHOC_EVAL_KEYS),
            "other_val_data": [] if i == 0 else other_val_data(configs[0], configs[i]),
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
    other = [r for r in rows if r["other_val_data"]]
    if other:
        who = "; ".join(f"{r['id']} ({', '.join(r['other_val_data'])})" for r in other)
        notes.append(f"≠ validated on other data than A: {who}. Their val losses are on other text, tokens or rows "
                     "than A's, so their Δ columns compare nothing; compare runs that validate alike (or score "
                     "them on one set: `speedgpt eval RUN --data DIR --tokens N`).")
    posthoc = [r["id"] for r in rows if r["posthoc_eval"]]
    if posthoc:
        notes.append(f"val records of {', '.join(posthoc)} include `speedgpt eval` results (their own data and "
                     "token count): compare them only with evals of the same data.")
    return notes


def _no_config(row: dict[str, Any]) -> str:
    return "config.toml unreadable" if row.get("config_unreadable") else "no config.toml"


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
            overrides = f"– ({_no_config(r)})"
        elif r["overrides"] is None:
            overrides = f"– (A: {_no_config(base)})"
        else:
            overrides = ", ".join(code(o) for o in r["overrides"]) or "(same config)"
        other = "≠" if r.get("other_val_data") else ""  # Δ of losses on other val data (the notes say which)
        cells = [f"{r['id']}: {r['run']}", overrides, _fmt(r["final_val_loss"], ".4f"),
                 _fmt_delta(r["delta_final"]) + (other if r["delta_final"] is not None else ""),
                 fmt_duration(r["train_time_s"]), _fmt(r["mean_tok_per_s"], ",.0f")]
        for ax in ("time", "tokens"):
            value, delta = r[f"val_at_equal_{ax}"], r[f"delta_at_equal_{ax}"]
            mid, base_mid = r[f"mid_run_{ax}"], base[f"mid_run_{ax}"]
            biased = delta is not None and not r["baseline"] and (mid or base_mid)
            cells += [_fmt(value, ".4f") + (mark if mid else ""),
                      _fmt_delta(delta) + (mark if biased else "") + (other if delta is not None else "")]
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
