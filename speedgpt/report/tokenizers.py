"""The tokenizer table of a report: for each run that trained with its own tokenizer, its name and
vocabulary, and bytes per token of the run's validation text under it and under GPT-2's (the
"tokenizer" event the trainer logs, speedgpt/train/tokenizer.py). Runs on GPT-2 have no row."""

from __future__ import annotations

from .runs import RunData
from .tables import _fmt, fmt_count

HEADERS = ["run", "tokenizer", "vocab", "bytes/token", "gpt2 bytes/token", "measured on"]


def tokenizer_table(runs: list[RunData]) -> tuple[list[str], list[list[str]]] | None:
    """(headers, lines), or None when no run has its own tokenizer."""
    lines = []
    for run in runs:
        rec = next((r for r in run.records if r.get("event") == "tokenizer"), None)
        if rec is not None:
            lines.append([run.label, f"{rec.get('tokenizer', '?')} ({rec.get('tokenizer_id', '?')})",
                          f"{rec.get('vocab_size', 0):,}", _fmt(rec.get("bytes_per_token"), ".3f"),
                          _fmt(rec.get("gpt2_bytes_per_token"), ".3f"),
                          f"{fmt_count(rec.get('tokenizer_bytes'))} bytes of val text"])
    return (HEADERS, lines) if lines else None
