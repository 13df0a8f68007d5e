"""Mixed rows (``data.long_docs = "mix"``): every row holds pieces of many documents, no token skipped.

Why: on long documents (code, books, papers) a greedy ``split`` row is a few long files cut in order,
and ``crop`` rows throw most tokens away (docs/data.md). The documents a batch holds decide how fast
the loss falls (issue 32), so this planner keeps ``mix_docs`` documents *open* and fills each row with
the next piece of one open document after another:

* The open documents take turns in rounds; each round visits every slot once in a random order drawn
  from ``(seed, round)``, so a row of P pieces holds about min(P, mix_docs) distinct documents and a
  document's pieces land about a round apart (rows and steps later) instead of side by side.
* A piece is at most the stage's ``max_doc_len`` tokens (its BOS included; 0: no cap) and at most the
  row's room. The first piece of a document starts with its own BOS; every later piece gets a BOS put
  in front, so the attention masks see each piece as a document of its own (as ``split`` does).
* A slot whose document is used up opens the next document of the stream at its next turn. Documents
  are opened in stream order, so every token of an epoch goes into exactly one row, and the epoch's
  last documents finish while the next epoch's first ones are read. A slot opens no document of epoch
  e + 1 while one of epoch e - 1 is still open (at most two epochs are open, as the stream keeps two),
  nor while epoch e, having fewer documents than slots, still has one open (a small corpus would
  otherwise hold two copies of a document open at once).

The whole position is a ``MixState``: the next unread stream position, the open documents and where
the current round stands. Planning is a pure function of it, so resume is exact and every rank plans
the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stream import EpochStreams

DEFAULT_MIX_DOCS = 1024
_ROUND_TAG = 0x6D6978  # keeps the rounds' random streams apart from the epochs' shuffles of the same seed


@dataclass(frozen=True)
class MixState:
    epoch: int  # the next unread document: (epoch, position in that epoch's stream)
    pos: int
    # per slot, the open document (epoch, next token, end, continued) or None; continued: its next piece
    # needs a BOS in front (it is not the document's first, or the document began before its shard)
    docs: tuple[tuple[int, int, int, bool] | None, ...]
    opened: int = 0  # documents opened from `epoch` so far
    round: int = 0  # rounds of turns begun so far
    turn: int = 0  # slots of the current round that had their turn
    row_tokens: int = 0  # tokens put into rows so far (inserted BOS included)
    cropped: int = 0  # always 0: no token is skipped
    rows: int = 0  # rows planned so far, and the distinct documents they held (summed over rows)
    row_docs: int = 0

    def to_dict(self) -> dict:
        return {"opened": self.opened, "round": self.round, "turn": self.turn, "rows": self.rows,
                "row_docs": self.row_docs,
                "open": [None if d is None else [d[0], d[1], d[2], int(d[3])] for d in self.docs]}

    @classmethod
    def from_dict(cls, state: dict) -> "MixState":
        """From a loader state dict (its epoch, position and counts plus this planner's "mix" entry)."""
        m = state["mix"]
        docs = tuple(None if d is None else (int(d[0]), int(d[1]), int(d[2]), bool(d[3])) for d in m["open"])
        return cls(int(state["epoch"]), int(state["position"]), docs, int(m["opened"]), int(m["round"]), int(m["turn"]),
                   int(state.get("row_tokens", 0)), 0, int(m["rows"]), int(m["row_docs"]))


class MixRows:
    """Plans mixed rows over the epoch streams of a loader (data/stream.py ``EpochStreams``)."""

    def __init__(self, streams: EpochStreams, mix_docs: int = DEFAULT_MIX_DOCS, seed: int = 0):
        if mix_docs < 1:
            raise ValueError(f"mix_docs={mix_docs} must be at least 1")
        self.streams, self.mix_docs, self.seed = streams, mix_docs, seed
        # The next document starts of one epoch's stream, fetched many at a time (opening a document is then
        # a list lookup, not two binary searches): (epoch, positions, index of the next one). Derived from
        # the position alone, so it is no part of the state.
        self._starts: tuple[int, list[int], int] = (-1, [], 0)

    def initial_state(self) -> MixState:
        return MixState(0, 0, (None,) * self.mix_docs)

    def _order(self, rnd: int) -> list[int]:
        """The slots in the order round `rnd` visits them."""
        return np.random.default_rng([self.seed, _ROUND_TAG, rnd]).permutation(self.mix_docs).tolist()

    def _open(self, epoch: int, pos: int, opened: int, docs: list):
        """(the next document (epoch, start, end, continued) or None, epoch, pos, opened): None when the next
        epoch must wait for the documents still open (module docstring)."""
        stream = self.streams.stream(epoch)
        if pos >= stream.total:
            oldest = min((d[0] for d in docs if d is not None), default=epoch + 1)
            if oldest < epoch or (oldest == epoch and opened < self.mix_docs):  # this slot waits for them
                return None, epoch, pos, opened
            epoch, pos, opened = epoch + 1, 0, 0
            stream = self.streams.stream(epoch)
        end = self._next_start(stream, epoch, pos)
        # A document opens where the one before it ended, at a BOS, except at the stream's start (a shard
        # may begin with a headless fragment: its first piece gets a BOS put in front).
        return (epoch, pos, end, pos == 0 and not stream.is_bos(0)), epoch, end, opened + 1

    def _next_start(self, stream, epoch: int, pos: int) -> int:
        """stream.next_bos(pos + 1), from the cached run of document starts."""
        cached_epoch, starts, i = self._starts
        if cached_epoch != epoch or (i and starts[i - 1] > pos):  # another epoch, or behind the cached run
            starts, i = [], 0
        while i < len(starts) and starts[i] <= pos:
            i += 1
        if i == len(starts):
            starts, i = stream.bos_from(pos + 1, 512).tolist(), 0
            if not starts:  # no document starts after pos: this one ends with the stream
                self._starts = (-1, [], 0)
                return stream.total
        self._starts = (epoch, starts, i + 1)
        return starts[i]

    def plan(self, state: MixState, n_rows: int, row_len: int, max_doc: int = 0) -> tuple[list[list[tuple]], MixState]:
        """`n_rows` rows of `row_len` tokens, each a list of pieces (epoch, start, end, bos) to copy in
        order (a BOS put in front when bos); and the state after them."""
        if row_len > self.streams.stream(state.epoch).total:  # a row would hold some tokens twice
            raise ValueError(
                f"the data ({self.streams.stream(state.epoch).total:,} tokens in {len(self.streams.shards.files)} "
                f"shards) is shorter than one row of seq_len+1={row_len} tokens; use a smaller seq_len or more data")
        docs = list(state.docs)
        epoch, pos, opened, rnd, turn = state.epoch, state.pos, state.opened, state.round, state.turn
        order = self._order(rnd)
        cap = max_doc if max_doc > 0 else row_len
        rows, row_docs = [], 0
        idle = 0  # turns in a row that found no document (only a waiting epoch change causes them)
        blocked = False  # the next epoch waits: no slot can open a document until an open one is used up
        for _ in range(n_rows):
            pieces, filled, ids = [], 0, set()
            while filled < row_len:
                if turn == self.mix_docs:
                    rnd, turn = rnd + 1, 0
                    order = self._order(rnd)
                slot = order[turn]
                turn += 1
                doc = docs[slot]
                if doc is None:
                    if not blocked:
                        doc, epoch, pos, opened = self._open(epoch, pos, opened, docs)
                    if doc is None:
                        blocked, idle = True, idle + 1
                        if idle > 2 * self.mix_docs:
                            raise RuntimeError("mix planner made no progress (a bug): no open document")
                        continue
                idle = 0
                e, start, end, cont = doc
                # tokens of the document: its rest, within the row's room and the cap, both counting the BOS put
                # in front of a continuation (a cap of 1 still moves on by one token); 0 when only that BOS fits
                n = end - start
                room = row_len - filled - cont
                if room < n:
                    n = room
                if cap - cont < n:
                    n = cap - cont if cap > cont else 1
                pieces.append((e, start, start + n, cont))
                if n:
                    ids.add((e, end))
                filled += n + cont
                if start + n < end:
                    docs[slot] = (e, start + n, end, True)
                else:
                    docs[slot], blocked = None, False
            rows.append(pieces)
            row_docs += len(ids)
        return rows, MixState(epoch, pos, tuple(docs), opened, rnd, turn, state.row_tokens + n_rows * row_len, 0,
                              state.rows + n_rows, state.row_docs + row_docs)
