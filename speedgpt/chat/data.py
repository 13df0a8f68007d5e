"""Conversations for SFT: JSONL or Parquet files in the common `messages` form
(`{"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}` per line or
row), several mixed by weight (`FILE:WEIGHT`), or the built-in tasks (tasks.py) when none is given.

Every conversation is rendered (template.py) and checked as it is read; a bad one stops the command with
one line naming its file and line (or row). Exact copies of an earlier conversation are dropped and counted (the
run's start line says how many), so that none is both trained on and held out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .template import ChatTemplate, ConversationError


# Training conversations one --data file may put in an epoch (its own times its weight): the epoch is a list, shuffled
# and packed at the start of each pass
MAX_EPOCH_CONVERSATIONS = 10_000_000


class ChatDataError(ValueError):
    """Bad SFT data; the message names the file and line and what to do."""


@dataclass(frozen=True)
class Source:
    path: Path
    weight: float = 1.0


def split_source(spec: str) -> tuple[str, float | None]:
    """(FILE, WEIGHT) of "FILE:WEIGHT", (FILE, None) of "FILE" (a file whose name has a colon is a FILE);
    ChatDataError when the part after the last colon is no number."""
    head, _, tail = spec.rpartition(":")
    if not head or Path(spec).exists():
        return spec, None
    try:
        return head, float(tail)
    except ValueError:
        raise ChatDataError(f"--data {spec}: not a file, and '{tail}' is not a weight; pass FILE or "
                            f"FILE:WEIGHT (e.g. chats.jsonl:2)") from None


def parse_source(spec: str) -> Source:
    """"FILE" or "FILE:WEIGHT" (a weight > 0: how many times the file is read per epoch, 0.5 = its first half)."""
    path, weight = split_source(spec)
    weight = 1.0 if weight is None else weight
    if not math.isfinite(weight) or weight <= 0:
        raise ChatDataError(f"--data {spec}: weight {weight} must be a finite number > 0 (e.g. chats.jsonl:2)")
    p = Path(path).expanduser()
    if not p.is_file():
        what = "a folder" if p.is_dir() else "no such file"
        raise ChatDataError(f"--data {path}: {what}; pass a .jsonl or .parquet file of {{\"messages\": ...}}")
    if p.suffix not in (".jsonl", ".parquet"):
        raise ChatDataError(f"--data {path}: unknown format '{p.suffix}'; pass .jsonl or .parquet")
    return Source(p, weight)


def _records(path: Path) -> Iterator[tuple[str, object]]:
    """(where, record) of each line or row: where is "FILE line N" / "FILE row N"."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise ChatDataError(f"{path}: not a readable Parquet file ({e}); pass a .parquet table with a "
                                f"'messages' column, or JSONL") from None
        if "messages" not in table.column_names:
            raise ChatDataError(f"{path}: no 'messages' column (columns: {', '.join(table.column_names)}); "
                                f"each row needs messages = [{{role, content}}, ...]")
        for n, messages in enumerate(table.column("messages").to_pylist(), 1):
            yield f"{path} row {n}", {"messages": messages}
        return
    for n, line in utf8_lines(path, 'one {"messages": [...]} per line'):
        if not line.strip():
            continue
        try:
            yield f"{path} line {n}", json.loads(line)
        except json.JSONDecodeError as e:
            raise ChatDataError(f"{path} line {n}: not JSON ({e.msg}); one {{\"messages\": [...]}} "
                                f"per line") from None


def utf8_lines(path: Path, holds: str) -> Iterator[tuple[int, str]]:
    """(number, text) of each line of a JSONL file (SFT data, a chat task file); ChatDataError naming the file, the
    line and the fix for one that is not UTF-8 (`holds`: what a line should be). Decoded here: such a file (a .gz, a
    Latin-1 export) was Python's bare "'utf-8' codec can't decode byte 0xe9 in position 2843", naming no file."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                yield n, raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ChatDataError(f"{path} line {n}: not UTF-8 text; save it as UTF-8 JSONL, {holds}") from None


def read_conversations(path: Path, template: ChatTemplate, max_len: int) -> list[tuple[list[int], list[int]]]:
    """Every conversation of one file, rendered; at most `max_len` tokens each."""
    out = []
    for where, rec in _records(path):
        if not isinstance(rec, dict) or "messages" not in rec:
            raise ChatDataError(f"{where}: no 'messages' key; each line needs {{\"messages\": [{{\"role\", "
                                f"\"content\"}}, ...]}}")
        try:
            ids, mask = template.render(rec["messages"])
        except ConversationError as e:
            raise ChatDataError(f"{where}: {e}") from None
        if len(ids) > max_len:
            raise ChatDataError(f"{where}: the conversation has {len(ids)} tokens, more than the context's "
                                f"{max_len}; shorten or split it, or fine-tune with a longer data.seq_len")
        out.append((ids, mask))
    if not out:
        raise ChatDataError(f"{path}: no conversations")
    return out


@dataclass
class Mixture:
    """An SFT run's conversations from files: `train` (one epoch, each file's part `weight` times), `heldout` (never
    trained on), and how many exact copies of an earlier conversation were dropped."""

    train: list[tuple[list[int], list[int]]]
    heldout: list[tuple[list[int], list[int]]]
    duplicates: int


def mixture(sources: list[Source], template: ChatTemplate, max_len: int, every: int = 20) -> Mixture:
    """Every distinct conversation of the files, in file order, is held out if it is the `every`-th; each file's
    other conversations train `weight` times (a fraction: their first part). The held-out set is chosen before the
    weighting and after exact copies (the same rendered tokens, within or across files) are dropped, so no held-out
    conversation is ever trained on: a weight of 2, or a file that repeats another, made the held-out loss score
    training conversations."""
    seen: set[tuple[int, ...]] = set()
    train, heldout, duplicates = [], [], 0
    for s in sources:
        mine = []
        for conv in read_conversations(s.path, template, max_len):
            key = tuple(conv[0])  # the ids decide the mask too (the roles are tokens)
            if key in seen:
                duplicates += 1
                continue
            (heldout if len(seen) % every == 0 else mine).append(conv)  # the 1st, the (every+1)-th, ...
            seen.add(key)
        if len(mine) * s.weight > MAX_EPOCH_CONVERSATIONS:  # 1e30 was an OverflowError (exit 1), 1e9 a list of
            # billions held in memory: the epoch is built and shuffled whole at the start
            raise ChatDataError(f"--data {s.path}:{s.weight:g}: the weight makes {len(mine) * s.weight:.3g} training "
                                f"conversations of its {len(mine):,} an epoch, more than {MAX_EPOCH_CONVERSATIONS:,}; "
                                f"lower it (a weight sets the file's share of an epoch; more steps read more epochs)")
        whole, part = divmod(s.weight, 1.0)
        train += mine * int(whole) + mine[:round(part * len(mine))]
    return Mixture(train, heldout, duplicates)
