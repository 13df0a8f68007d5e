"""The training loader: BOS-aligned rows from token shards, per-rank slices, async prefetch.

How rows are made (docs/data.md has the full story and measured numbers):

* Each epoch's shards are one token stream (data/stream.py): epoch 0 in the given order, like
  the speedrun (or shuffled too, ``shuffle_first_epoch``); later epochs shuffle documents by
  ``(seed, epoch)`` (whole shards with ``packing="record28"``, whose shard changes follow the layout).
* A row is ``seq_len + 1`` tokens, planned as pieces of the stream by one of three planners:
  greedy rows of documents back to back (data/greedy.py; ``long_docs="split"``, the default,
  skips no token: a document longer than a stage's ``max_doc_len``, or cut by the row's end,
  goes on as further pieces; ``"crop"`` is the records' rows, which skip those tails; ``"mix"``
  fills each row with the next pieces of many open documents in a seeded random order: data/mix.py),
  best-fit rows (data/bestfit.py) or record #28's rows (data/record28.py).
* Every optimizer micro-batch takes ``world_size * batch_size`` consecutive rows of that
  sequence; rank ``r`` gets rows ``[r*B, (r+1)*B)``. All ranks plan the same rows (cheap: a few
  binary searches per row) and copy only their own.

The whole position in the data is one ``(epoch, position)`` pair (plus best-fit's or mix's buffer),
identical on all ranks, so ``state_dict()`` is tiny and resume is exact, even with a different
batch size, sequence length or world size after the resume. Every planner counts the tokens it
put into rows and the tokens it skipped (``cropped_share``), and the state keeps the counts.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .bestfit import DEFAULT_BUFFER_DOCS, BestFitPacker, BestFitState
from .greedy import GreedyRows
from .mix import DEFAULT_MIX_DOCS, MixRows, MixState
from .record28 import Record28Rows
from .shards import ShardError, find_shards
from .stream import BadShardHit, EpochStreams, ShardCache, position_without
from .tokenizer import BOS_ID

_STATE_FORMAT = "speedgpt.TokenLoader/1"
PACKINGS = ("greedy", "bestfit", "record28")
LONG_DOCS = ("split", "crop", "mix")


@dataclass(frozen=True)
class _GreedyState:
    epoch: int
    pos: int
    row_tokens: int = 0  # tokens put into rows so far
    cropped: int = 0  # tokens skipped so far (document tails, an epoch's last partial row)


def _resolve(files: list[Path] | list[str] | str | Path, split: str) -> list[Path]:
    if isinstance(files, (str, Path)):
        return find_shards(files, split)
    files = [Path(f) for f in files]
    if not files:
        raise FileNotFoundError(f"no {split} shards given (empty file list); pass shard paths, a directory or a glob")
    return files


class TokenLoader:
    """Infinite BOS-aligned training batches from token shards (see module docstring).

    ``next_batch`` returns inputs (B, T) int32 and targets (B, T) int64 on ``device``;
    every row's first input token is BOS. With ``prefetch`` the next batch is built on a
    background thread (into pinned memory when ``device`` is CUDA) while the caller trains.
    ``on_epoch`` (an attribute, callable(epoch)) is told when a new pass over the data
    begins; by default rank 0 emits a one-line ``warnings.warn``.
    """

    def __init__(
        self,
        files: list[Path] | str,
        *,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        bos_id: int = BOS_ID,
        prefetch: bool = True,
        seed: int = 0,
        packing: str = "greedy",
        buffer_docs: int = DEFAULT_BUFFER_DOCS,
        grad_accum: int = 1,
        on_bad_shard: str = "stop",
        vocab_size: int | None = None,
        long_docs: str = "split",
        continued_bos: bool = True,
        epoch_shuffle: str | None = None,
        mix_docs: int = DEFAULT_MIX_DOCS,
        shuffle_first_epoch: bool = False,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if packing not in PACKINGS:
            raise ValueError(f"packing={packing!r} must be one of {', '.join(PACKINGS)}")
        if long_docs not in LONG_DOCS:
            raise ValueError(f"long_docs={long_docs!r} must be one of {', '.join(LONG_DOCS)}")
        if not continued_bos and (packing != "greedy" or long_docs == "mix"):  # other documents' pieces sit between
            raise ValueError("continued_bos=False works with packing='greedy' and long_docs split or crop only")
        if long_docs == "mix" and packing != "greedy":
            raise ValueError(f"long_docs='mix' works with packing='greedy' only, not {packing!r}")
        _check_shape(batch_size, seq_len)
        self.files = _resolve(files, "train")
        self.seq_len, self.batch_size = seq_len, batch_size
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.bos_id = bos_id
        self.seed = seed
        if on_bad_shard not in ("stop", "skip"):
            raise ValueError(f"on_bad_shard={on_bad_shard!r} must be 'stop' or 'skip'")
        if on_bad_shard == "skip" and (packing == "bestfit" or long_docs == "mix"):  # buffered documents would need
            raise ValueError("on_bad_shard='skip' works with packing='greedy' and long_docs split or crop only")
        self.on_bad_shard = on_bad_shard
        self._shards = ShardCache(self.files, bos_id, lenient=on_bad_shard == "skip", vocab_size=vocab_size)
        # Record #28's shard changes follow the shard layout, so its later epochs permute whole shards.
        epoch_shuffle = epoch_shuffle or ("shards" if packing == "record28" else "docs")
        self._streams = EpochStreams(self._shards, seed, epoch_shuffle, shuffle_first=shuffle_first_epoch)
        self.packing, self.long_docs, self.continued_bos = packing, long_docs, continued_bos
        self._greedy = GreedyRows(self._streams, long_docs, continued_bos) if long_docs != "mix" else None
        self._mix = MixRows(self._streams, mix_docs, seed) if long_docs == "mix" else None
        self._record28 = Record28Rows(self._streams)
        self._bestfit = BestFitPacker(self._streams, buffer_docs, split=long_docs == "split") \
            if packing == "bestfit" else None
        # record28: every grad_accum-th batch starts an optimizer step, where the record may change shard
        self.grad_accum, self._micro = grad_accum, 0
        if self._shards.total < seq_len + 1:
            raise ValueError(
                f"the data ({self._shards.total:,} tokens in {len(self._shards.files)} shards) is shorter than one "
                f"row of seq_len+1={seq_len + 1} tokens; use a smaller seq_len or more data"
            )
        # Pinned host memory only helps (and only works) when copying to a CUDA device.
        self._pin = self.device.type == "cuda"
        self._state = self._initial_state()  # position after the last batch handed out
        self._lock = threading.Lock()  # one batch build at a time (caller thread or prefetcher)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="TokenLoader") if prefetch else None
        self._pending: tuple[tuple, Future] | None = None
        self.on_epoch: Callable[[int], None] | None = self._default_epoch_notice
        # Bad shards skipped in the batches handed out so far: name -> first epoch without it. Part
        # of the state, so a resumed run plans the same rows.
        self.skipped_shards: dict[str, int] = {}

    def _initial_state(self):
        if self._mix:
            return self._mix.initial_state()
        return BestFitState(0, 0, ()) if self._bestfit else _GreedyState(0, 0)

    @property
    def epoch(self) -> int:
        """Completed passes over the data (counts up when a batch from the next pass is handed out;
        with best-fit packing, when the buffer starts reading the next pass)."""
        return self._state.epoch

    @property
    def corpus_tokens(self) -> int:
        """Tokens in one epoch of the training shards."""
        return self._shards.total

    @property
    def cropped_share(self) -> float:
        """Of the data tokens consumed so far, the share cropped (never put into a row)."""
        st = self._state
        return st.cropped / (st.cropped + st.row_tokens) if st.row_tokens else 0.0

    @property
    def row_docs(self) -> tuple[int, int] | None:
        """(rows handed out, distinct documents those rows held, summed over rows) with long_docs="mix"
        (every rank's rows: the same on all ranks); None otherwise."""
        st = self._state
        return (st.rows, st.row_docs) if isinstance(st, MixState) else None

    def preview_docs_per_row(self, batch_size: int, seq_len: int, max_doc_len: int = 0) -> float | None:
        """Mean distinct documents per row of the next batch of this shape, planned without handing it out
        (the run's start line); None unless long_docs="mix"."""
        if self._mix is None:
            return None
        with self._lock:
            _, after = self._mix.plan(self._state, self.world_size * batch_size, seq_len + 1, max_doc_len)
        return (after.row_docs - self._state.row_docs) / (after.rows - self._state.rows)

    def _default_epoch_notice(self, epoch: int) -> None:
        if self.rank == 0:
            # Not "every token was used": crop rows skip tails, so say what share of the reading was trained on.
            cropped = (f"; {self.cropped_share:.1%} of the tokens read so far were cropped, never trained on "
                       f"(data.long_docs={self.long_docs}, packing={self.packing})" if self._state.cropped else "")
            warnings.warn(
                f"TokenLoader: starting epoch {epoch + 1}: reading the {self._shards.total:,} tokens in "
                f"{len(self._shards.files)} shards again (data repeats from here on){cropped}",
                stacklevel=3,
            )

    def _plan(self, state, n_rows: int, row_len: int, max_doc: int = 0):
        """(rows, each a list of pieces (epoch, start, end, continued), and the state after them)."""
        if self._bestfit is not None:
            return self._bestfit.plan(state, n_rows, row_len)
        if self._mix is not None:
            return self._mix.plan(state, n_rows, row_len, max_doc)
        epoch, pos, cropped = state.epoch, state.pos, state.cropped
        rows = []
        for _ in range(n_rows):
            if self.packing == "record28":
                pieces, epoch, pos, crop = self._record28.row(epoch, pos, row_len)
            else:
                pieces, epoch, pos, crop = self._greedy.row(epoch, pos, row_len, max_doc)
            rows.append(pieces)
            cropped += crop
        return rows, _GreedyState(epoch, pos, state.row_tokens + n_rows * row_len, cropped)

    def _build(self, state, batch_size: int, seq_len: int, max_doc: int = 0):
        row_len = seq_len + 1
        skipped: dict[str, int] = {}
        with self._lock:
            while True:
                try:
                    buf, end_state = self._plan_and_copy(state, batch_size, row_len, max_doc)
                    break
                except BadShardHit as hit:
                    state = self._skip_shard(hit, state, skipped)
        inputs = torch.empty((batch_size, seq_len), dtype=torch.int32, pin_memory=self._pin)
        targets = torch.empty((batch_size, seq_len), dtype=torch.int64, pin_memory=self._pin)
        np.copyto(inputs.numpy(), buf[:, :-1], casting="unsafe")
        np.copyto(targets.numpy(), buf[:, 1:], casting="unsafe")
        return inputs, targets, end_state, skipped

    def _plan_and_copy(self, state, batch_size: int, row_len: int, max_doc: int = 0):
        rows, state = self._plan(state, self.world_size * batch_size, row_len, max_doc)
        buf = np.empty((batch_size, row_len), dtype=np.uint32)  # holds uint16 and uint32 (32-bit shards) ids
        for i, pieces in enumerate(rows[self.rank * batch_size : (self.rank + 1) * batch_size]):
            at = 0
            for epoch, start, end, bos in pieces:
                if bos:
                    buf[i, at] = self.bos_id
                    at += 1
                self._streams.stream(epoch).copy(start, end, buf[i, at : at + end - start])
                at += end - start
        return buf, state

    def _skip_shard(self, hit: BadShardHit, state, skipped: dict[str, int]):
        """Report a bad shard, or leave it out of its epoch and every later one and return where the
        batch now starts: positions before its spans are unchanged, inside one move to what followed
        it, after them shift down by their sizes (the same mapping a resumed run's layout gives)."""
        path = self._shards.files[hit.index]
        where = f"at byte {hit.error.offset}" if hit.error.offset is not None else "(offset unknown)"
        if self.on_bad_shard != "skip":
            raise ShardError(f"bad training shard {path} {where}, met during training: {hit.error}; or set "
                             f"--data.on_bad_shard=skip to skip it and go on", offset=hit.error.offset) from None
        try:
            spans = self._streams.stream(hit.epoch).spans_of(hit.index)
        except BadShardHit:  # met while laying out that epoch's stream: no position lies in it yet
            spans = []
        self._streams.exclude(hit.index, hit.epoch)
        pos = position_without(spans, state.pos) if hit.epoch == state.epoch else state.pos
        skipped[path.name] = hit.epoch
        if self.rank == 0:
            warnings.warn(f"TokenLoader: skipping bad shard {path} {where} (epoch {hit.epoch + 1} on; "
                          f"data.on_bad_shard=skip): {hit.error}", stacklevel=2)
        return dataclasses.replace(state, pos=pos)

    def set_grad_accum(self, grad_accum: int) -> None:
        """Batches per optimizer step from the next batch on (a stage boundary changes it); call
        between optimizer steps. Only record28 packing reads it (its shard change at a step's start)."""
        if grad_accum < 1:
            raise ValueError(f"grad_accum={grad_accum} must be >= 1")
        self.grad_accum, self._micro = grad_accum, 0

    def next_batch(self, batch_size: int | None = None, seq_len: int | None = None,
                   max_doc_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs (B, T) int32 and targets (B, T) int64 on ``device``; every row's first input token is
        BOS (unless ``continued_bos=False`` and the row continues a document).

        batch_size/seq_len may change between calls (batch-size and sequence-length schedules).
        ``max_doc_len`` > 0 (greedy packing): no row piece is longer than that many tokens (the rest of
        the document follows as further pieces, or is skipped with ``long_docs="crop"``: data/greedy.py);
        it may change between calls too.
        """
        batch_size = self.batch_size if batch_size is None else batch_size
        seq_len = self.seq_len if seq_len is None else seq_len
        _check_shape(batch_size, seq_len)
        if max_doc_len and self.packing != "greedy":
            raise ValueError(f"max_doc_len works with packing='greedy' only, not {self.packing!r}")
        if max_doc_len < 0:
            raise ValueError(f"max_doc_len={max_doc_len} must be >= 0 (0: no cap)")
        if self.packing == "record28":
            if self._micro % self.grad_accum == 0:  # the record's window: 2 x the step's tokens on all ranks
                st = self._state
                window = 2 * self.grad_accum * self.world_size * batch_size * seq_len
                pos = self._record28.step_start(st.epoch, st.pos, window)
                self._state = _GreedyState(st.epoch, pos, st.row_tokens, st.cropped + pos - st.pos)
            self._micro += 1
        key = (self._state, batch_size, seq_len, max_doc_len)
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == key:
            inputs, targets, state, skipped = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()  # built for another shape or position: discard it
            inputs, targets, state, skipped = self._build(*key)
        previous_epoch = self._state.epoch
        self._state = state  # the state counts batches handed out, not prefetched
        self.skipped_shards.update(skipped)
        if self._executor is not None:
            # Guess that the next call asks for the same shape; a wrong guess only costs a rebuild.
            key = (state, batch_size, seq_len, max_doc_len)
            self._pending = (key, self._executor.submit(self._build, *key))
        if state.epoch > previous_epoch and self.on_epoch is not None:
            self.on_epoch(state.epoch)
        if self.device.type != "cpu":
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
        return inputs, targets

    def state_dict(self) -> dict:
        """The position after the last batch handed out: plain, JSON-able, the same on every rank."""
        st = self._state
        out = {
            "format": _STATE_FORMAT,
            "epoch": st.epoch,
            "position": st.pos,
            "seed": self.seed,
            "files": [f.name for f in self._shards.files],
            "total_tokens": self._shards.total,
            "packing": self.packing,
            "long_docs": self.long_docs,
            "continued_bos": self.continued_bos,
            "shuffle": self._streams.shuffle,
            "shuffle_first_epoch": self._streams.shuffle_first,
            "row_tokens": st.row_tokens,
            "cropped": st.cropped,
            "skipped_shards": dict(self.skipped_shards),
        }
        if isinstance(st, BestFitState):
            out["buffer"] = st.to_dict()["buffer"]
        if isinstance(st, MixState):
            out["mix"] = {"mix_docs": self._mix.mix_docs, **st.to_dict()}
        return out

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where ``state`` was taken; the data must be the same shards."""
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"loader state has format {state.get('format')!r}, expected {_STATE_FORMAT!r}")
        names = [f.name for f in self._shards.files]
        if state["files"] != names or state["total_tokens"] != self._shards.total:
            raise ValueError(
                f"loader state was saved for {len(state['files'])} shards / {state['total_tokens']:,} tokens, "
                f"but this loader has {len(names)} shards / {self._shards.total:,} tokens; "
                "resume with the same training data"
            )
        if state["seed"] != self.seed:
            raise ValueError(f"loader state has seed {state['seed']}, this loader seed {self.seed}; use the same seed")
        packing = state.get("packing", "greedy")  # states from before packing was a choice are greedy
        if packing != self.packing:
            raise ValueError(f"loader state was saved with data.packing={packing!r}, this loader packs "
                             f"{self.packing!r}; resume with --data.packing={packing}")
        # States from before long_docs existed come from rows that cropped.
        mine = {"long_docs": self.long_docs, "continued_bos": self.continued_bos,
                "shuffle_first_epoch": self._streams.shuffle_first}
        for key, old in (("long_docs", "crop"), ("continued_bos", True), ("shuffle_first_epoch", False)):
            if state.get(key, old) != mine[key]:
                value = str(state.get(key, old)).lower()
                raise ValueError(f"loader state was saved with data.{key}={value}, this loader has "
                                 f"{str(mine[key]).lower()}; resume with --data.{key}={value}")
        if self._mix is not None and len(state["mix"]["open"]) != self._mix.mix_docs:
            saved = len(state["mix"]["open"])
            raise ValueError(f"loader state was saved with data.mix_docs={saved}, this loader has "
                             f"{self._mix.mix_docs}; resume with --data.mix_docs={saved}")
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None
        self._micro = 0  # states are taken between optimizer steps
        counts = dict(row_tokens=int(state.get("row_tokens", 0)), cropped=int(state.get("cropped", 0)))
        if packing == "bestfit":
            self._state = BestFitState.from_dict({**state, **counts})
        elif self._mix is not None:
            self._state = MixState.from_dict(state)
        else:
            self._state = _GreedyState(int(state["epoch"]), int(state["position"]), **counts)
        self.skipped_shards = dict(state.get("skipped_shards", {}))
        # Later epochs of states from before documents were shuffled permuted whole shards: resume them so.
        self._streams.shuffle = state.get("shuffle", "shards")
        self._streams.excluded.clear()
        index = {f.name: i for i, f in enumerate(self._shards.files)}
        for name, epoch in self.skipped_shards.items():
            self._streams.exclude(index[name], int(epoch))
        self._streams.clear()

    def close(self) -> None:
        """Stop the prefetch thread (also safe to skip: it exits with the process)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
            self._pending = None


def _check_shape(batch_size: int, seq_len: int) -> None:
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size={batch_size} and seq_len={seq_len} must both be >= 1")
