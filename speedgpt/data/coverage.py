"""What ``data.long_docs="crop"`` keeps of the training data, known before the first step.

A crop row cuts every document to the stage's ``max_doc_len`` and skips the tail, and skips the rest of
the document the row's end cuts (data/greedy.py), so one pass over the shards trains on less than
``sum(min(length, max_doc_len))`` tokens: on a corpus of a few long documents a few hundred tokens,
read again and again while the log counted "epochs" of the whole corpus (issue 36). The document
lengths come from one vectorised pass over the shards' BOS positions (a memory map), done only when a
crop run caps documents; the rows are then walked one searchsorted step each. The same lengths (or the
first shards', for other packings) tell what share of the tokens a cap leaves a whole attention window
(``full_window_share``: the start's warning, train/build.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .shards import ShardError, map_tokens, read_shard_info


@dataclass(frozen=True)
class Coverage:
    """The training shards as one pass: their tokens and the lengths of their documents (BOS included)."""

    total: int
    lengths: np.ndarray  # int64, one per document in stream order

    @property
    def documents(self) -> int:
        return len(self.lengths)

    def kept(self, max_doc: int, row_len: int) -> int:
        """Tokens of one pass that crop rows of `row_len` tokens keep when documents are cut to `max_doc`
        tokens (0: no cap, all). Exact for the first epoch's order (data/greedy.py's capped rows): a row
        takes the next documents cut to the cap, the one its end cuts loses the rest, and the next row
        starts at the next document; the pass's last, partial row is counted (it goes on into the next)."""
        if not max_doc:
            return self.total
        ends = np.concatenate([[0], np.cumsum(np.minimum(self.lengths, max_doc))])
        # The row that starts at document j ends inside document nxt[j] - 1; the next row starts at nxt[j].
        nxt = np.searchsorted(ends, ends[:-1] + row_len, side="left").tolist()
        n, j, rows = len(nxt), 0, 0
        while j < n and nxt[j] <= n:  # one step a row: ~0.1 s per million rows
            j, rows = nxt[j], rows + 1
        return rows * row_len + int(ends[n] - ends[j])

    def full_window_share(self, max_doc: int, window: int, *, crop: bool = False) -> float:
        """The share of the tokens rows train on that have `window` earlier tokens of their own document (or
        piece) behind them: a whole attention window. Documents are cut into pieces of <= `max_doc` tokens
        (0: whole), each piece a document of its own to the attention masks (mix and split), or with `crop`
        cut to their first `max_doc` tokens, the tails skipped. Row ends are not counted (a row is much longer
        than a window). Wave 5 (docs/experiments.md): 15 % against 82 % uncut made validation rise late."""
        n = self.lengths
        if not max_doc:
            full, kept = np.maximum(n - window, 0).sum(), n.sum()
        elif crop:
            head = np.minimum(n, max_doc)
            full, kept = np.maximum(head - window, 0).sum(), head.sum()
        else:
            pieces, rest = n // max_doc, n % max_doc
            full, kept = (pieces * max(max_doc - window, 0) + np.maximum(rest - window, 0)).sum(), n.sum()
        return float(full / kept) if kept else 0.0


def read_coverage(files: list[Path], bos_id: int, *, lenient: bool = False, max_tokens: int = 0) -> Coverage:
    """Coverage of `files` read as one stream (epoch 0's order). Tokens before the first BOS (a shard
    that starts mid-document) belong to no document: crop skips them. `lenient` (data.on_bad_shard=skip):
    a shard that fails its check is left out, as the loader leaves it out. `max_tokens` > 0: only the first
    shards, up to the one that reaches that many tokens (a sample of the documents' lengths)."""
    starts: list[np.ndarray] = []
    offset = 0
    for path in files:
        if max_tokens and offset >= max_tokens:
            break
        try:
            info = read_shard_info(path)
        except ShardError:
            if lenient:
                continue
            raise
        starts.append(np.flatnonzero(map_tokens(path, info) == bos_id) + offset)
        offset += info.n_tokens
    bos = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    return Coverage(offset, np.diff(np.append(bos, offset)).astype(np.int64))
