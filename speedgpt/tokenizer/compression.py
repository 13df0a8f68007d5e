"""How well a tokenizer compresses text, against GPT-2's: bytes per token (UTF-8 bytes of the text
over its token count, BOS not counted) and tokens per document. More bytes per token means shorter
sequences for the same text: more text per training step and per context window.

`speedgpt tokenizer eval` prints it per input; a run with its own tokenizer logs it for its
validation text (an event record "tokenizer" in metrics.jsonl, shown by the report).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .core import Tokenizer, gpt2_tokenizer

_BATCH_CHARS = 1 << 20  # texts per encode_ordinary_batch call: tiktoken encodes a batch on several threads


def measure(tok: Tokenizer, texts: Iterable[str], *, reference: Tokenizer | None = None) -> dict:
    """{documents, bytes, tokens, ref_tokens} of `texts` under `tok` and `reference` (GPT-2 by default)."""
    reference = reference or gpt2_tokenizer()
    out = {"documents": 0, "bytes": 0, "tokens": 0, "ref_tokens": 0}
    batch: list[str] = []

    def flush():
        out["tokens"] += sum(map(len, tok.encode_batch(batch)))
        out["ref_tokens"] += sum(map(len, reference.encode_batch(batch)))
        batch.clear()

    chars = 0
    for text in texts:
        out["documents"] += 1
        out["bytes"] += len(text.encode("utf-8", "surrogatepass"))
        batch.append(text)
        chars += len(text)
        if chars >= _BATCH_CHARS:
            flush()
            chars = 0
    if batch:
        flush()
    return out


def measure_tokens(tok: Tokenizer, tokens: np.ndarray, *, reference: Tokenizer | None = None) -> dict:
    """`measure` of the documents in a token stream of `tok` (split at BOS; a document cut by the
    stream's ends counts as it is). Bytes are exact (the tokens' own bytes); the reference encodes
    the decoded text."""
    starts = np.flatnonzero(tokens == tok.bos_id)
    bounds = [0, *starts.tolist(), len(tokens)]
    docs = (tokens[a:b] for a, b in zip(bounds, bounds[1:]))
    texts = (tok.decode(d[1:] if len(d) and d[0] == tok.bos_id else d) for d in docs)
    return measure(tok, (t for t in texts if t), reference=reference)


def compare_inputs(tok: Tokenizer, inputs: Sequence[str | os.PathLike], *, max_chars: int = 10_000_000,
                   text_field: str = "text") -> list[dict]:
    """One `measure` row per input (file, folder or glob), reading at most `max_chars` characters of each."""
    from ..data.tokenize import sources_from_paths

    rows = []
    for item in inputs:
        sources = sources_from_paths(item, text_field=text_field)
        left = [max_chars]

        def texts():
            for source in sources:
                for _, text in source.documents():
                    if left[0] <= 0:
                        return
                    text = text[:left[0]]
                    left[0] -= len(text)
                    yield text

        row = measure(tok, texts())
        row["input"] = str(item)
        row["capped"] = left[0] <= 0
        row["skipped"] = sum(s.skipped.total() for s in sources)
        row["skip_reasons"] = sorted({reason for s in sources for reason in s.skipped.counts})
        rows.append(row)
    return rows


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def table(tok: Tokenizer, rows: list[dict], reference_name: str = "gpt2") -> tuple[list[str], list[list[str]]]:
    """Headers and display strings: per input, bytes/token and tokens/document of both tokenizers."""
    from ..report.tables import _fmt, fmt_count

    headers = ["input", "docs", "bytes", f"{tok.name} bytes/token", f"{reference_name} bytes/token",
               f"{tok.name} tokens/doc", f"{reference_name} tokens/doc", f"tokens vs {reference_name}"]
    names = [Path(r["input"]).name or r["input"] for r in rows]
    if len(set(names)) < len(names):  # short names unless two inputs share one
        names = [r["input"] for r in rows]
    lines = []
    for r, name in zip(rows, names):
        lines.append([name + (" (capped)" if r.get("capped") else ""), f"{r['documents']:,}",
                      fmt_count(r["bytes"]), _fmt(ratio(r["bytes"], r["tokens"]), ".3f"),
                      _fmt(ratio(r["bytes"], r["ref_tokens"]), ".3f"),
                      _fmt(ratio(r["tokens"], r["documents"]), ",.1f"),
                      _fmt(ratio(r["ref_tokens"], r["documents"]), ",.1f"),
                      _fmt(None if not r["ref_tokens"] else 100 * (r["tokens"] / r["ref_tokens"] - 1), "+.1f", "%")])
    return headers, lines
