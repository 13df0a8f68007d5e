"""The training loader: BOS-aligned rows from token shards, per-rank slices, async prefetch.

How rows are made (docs/data.md has the full story and measured numbers):

* The shards of one epoch are read as one stream (epoch 0 in the given order, like the
  speedrun; later epochs in an order shuffled by ``(seed, epoch)``).
* A row is ``seq_len + 1`` consecutive tokens starting at a document start (BOS), so
  whole documents are packed back to back. The document cut by the row's end is
  cropped (its tail is skipped, the next row starts at the next BOS), unless the
  document is longer than a row: then it is split, and the next row continues it
  after a BOS inserted in front, so long documents are never dropped.
* Every optimizer micro-batch takes ``world_size * batch_size`` consecutive rows of
  that sequence; rank ``r`` gets rows ``[r*B, (r+1)*B)``. All ranks plan the same rows
  (cheap: a few binary searches per row) and copy only their own.

The whole position in the data is one ``(epoch, position)`` pair, identical on all
ranks, so ``state_dict()`` is tiny and resume is exact, even with a different
batch size, sequence length or world size after the resume.

``packing="bestfit"`` fills rows from a buffer of documents instead (data/bestfit.py); its
state adds the buffer. ``packing="record28"`` cuts rows as modded-nanogpt record #28 does
(``_Planner.next_row_record28``): no inserted BOS, long documents lose their tail, and a step
moves on to the next shard when the current one has fewer than twice its tokens left. Greedy rows
with a maximum document length (``next_batch(..., max_doc_len=N)``, a training stage's key) are
whole documents cut to N tokens each, tails skipped (``_Planner.next_row_capped``). All count the
tokens they put into rows and the tokens they crop (``cropped_share``), and keep the counts in the state.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .bestfit import DEFAULT_BUFFER_DOCS, BestFitPacker, BestFitState
from .shards import ShardError, claimed_tokens, find_shards, load_shard, read_header
from .tokenizer import BOS_ID

_STATE_FORMAT = "speedgpt.TokenLoader/1"
PACKINGS = ("greedy", "bestfit", "record28")


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


class _BadShardHit(Exception):
    """Loading shard `index` failed while planning `epoch`'s stream (internal to TokenLoader)."""

    def __init__(self, index: int, epoch: int, error: ShardError):
        super().__init__(str(error))
        self.index, self.epoch, self.error = index, epoch, error


class _Shards:
    """Sizes of all shards plus an LRU cache of loaded shards and their BOS positions."""

    def __init__(self, files: list[Path], bos_id: int, capacity: int = 3, *, lenient: bool = False,
                 vocab_size: int | None = None):
        self.bos_id = bos_id
        self.vocab_size = vocab_size
        # Every file is validated up front; `lenient` (data.on_bad_shard=skip) takes the size a
        # header claims instead, so a shard that broke mid-run keeps its place in the layout a
        # resumed run recomputes, and is skipped where it is met.
        sizes = [claimed_tokens(f) if lenient else read_header(f) for f in files]
        # Empty shards hold nothing; dropping them keeps "shard i has a token" true below.
        kept = [(f, n) for f, n in zip(files, sizes) if n > 0]
        if not kept:
            raise ValueError(f"all {len(files)} shards are empty (first: {files[0]}); re-create the data")
        self.files = [f for f, _ in kept]
        self.sizes = np.array([n for _, n in kept], dtype=np.int64)
        self.total = int(self.sizes.sum())
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens uint16 or uint32, BOS positions int64) of shard i."""
        with self._lock:
            hit = self._cache.get(i)
            if hit is not None:
                self._cache.move_to_end(i)
                return hit
        tokens = load_shard(self.files[i], vocab_size=self.vocab_size).numpy()
        # One vectorised pass per shard load; every row boundary afterwards is a binary search.
        bos = np.flatnonzero(tokens == self.bos_id)
        with self._lock:
            self._cache[i] = (tokens, bos)
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        return tokens, bos


class _EpochStream:
    """The shards of one epoch, in that epoch's order, seen as one token stream."""

    def __init__(self, shards: _Shards, order: np.ndarray, epoch: int = 0):
        self.shards = shards
        self.order = order
        self.epoch = epoch
        self.starts = np.concatenate([[0], np.cumsum(shards.sizes[order])])
        self.total = int(self.starts[-1])

    def _locate(self, g: int) -> int:
        return int(np.searchsorted(self.starts, g, side="right")) - 1

    def _shard(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self.shards.get(int(self.order[k]))
        except ShardError as e:
            raise _BadShardHit(int(self.order[k]), self.epoch, e) from None

    def is_bos(self, g: int) -> bool:
        k = self._locate(g)
        return bool(self._shard(k)[0][g - self.starts[k]] == self.shards.bos_id)

    def last_bos_between(self, lo: int, hi: int) -> int:
        """The last BOS position b with lo < b < hi, or -1."""
        k = self._locate(hi - 1)
        while k >= 0 and self.starts[k + 1] > lo + 1:
            _, bos = self._shard(k)
            j = int(np.searchsorted(bos, hi - self.starts[k], side="left")) - 1
            if j >= 0:
                b = int(self.starts[k] + bos[j])
                return b if b > lo else -1
            k -= 1
        return -1

    def next_bos(self, g: int) -> int:
        """The first BOS position >= g, or the stream's end."""
        k = self._locate(g)
        while k < len(self.order):
            _, bos = self._shard(k)
            j = int(np.searchsorted(bos, max(g - self.starts[k], 0), side="left"))
            if j < len(bos):
                return int(self.starts[k] + bos[j])
            k += 1
        return self.total

    def copy(self, start: int, end: int, out: np.ndarray) -> None:
        """out[:] = stream[start:end] (may span shards)."""
        k = self._locate(start)
        filled = 0
        while start + filled < end:
            tokens, _ = self._shard(k)
            lo = start + filled - self.starts[k]
            n = min(end - start - filled, len(tokens) - lo)
            out[filled : filled + n] = tokens[lo : lo + n]
            filled += n
            k += 1


@dataclass(frozen=True)
class _Row:
    epoch: int
    start: int
    end: int
    continued: bool  # starts mid-document: a BOS is put in front of stream[start:end]


class _Planner:
    """Decides row boundaries; a pure function of (epoch, position, row length)."""

    def __init__(self, shards: _Shards, seed: int):
        self.shards = shards
        self.seed = seed
        self._streams: OrderedDict[int, _EpochStream] = OrderedDict()
        self.excluded: dict[int, int] = {}  # bad shard index -> first epoch whose stream leaves it out

    def exclude(self, index: int, from_epoch: int) -> None:
        self.excluded[index] = from_epoch
        self._streams.clear()

    def stream(self, epoch: int) -> _EpochStream:
        s = self._streams.get(epoch)
        if s is None:
            n = len(self.shards.files)
            # Epoch 0 keeps the given order (the speedrun reads its shards in order); later
            # passes reshuffle shard order so repeated data is not seen in the same sequence.
            order = np.arange(n) if epoch == 0 else np.random.default_rng([self.seed, epoch]).permutation(n)
            if self.excluded:
                order = np.array([i for i in order if self.excluded.get(int(i), epoch + 1) > epoch], dtype=np.int64)
                if not len(order):
                    raise ShardError(f"every training shard is bad ({len(self.excluded)} skipped); re-create the data")
            s = self._streams[epoch] = _EpochStream(self.shards, order, epoch)
            while len(self._streams) > 2:
                self._streams.popitem(last=False)
        return s

    def next_row(self, epoch: int, pos: int, row_len: int) -> tuple[_Row, int, int, int]:
        """(row, next epoch, next position, tokens cropped) for a row starting at (epoch, pos)."""
        stream = self.stream(epoch)
        cropped = 0
        continued = pos < stream.total and not stream.is_bos(pos)
        if pos + row_len - continued > stream.total:
            # The rest of this epoch cannot fill a row: it is cropped and the next pass begins.
            cropped = max(stream.total - pos, 0)
            epoch, pos = epoch + 1, 0
            stream = self.stream(epoch)
            continued = not stream.is_bos(0)
            if row_len - continued > stream.total:
                raise ValueError(
                    f"the data ({stream.total:,} tokens in {len(self.shards.files)} shards) is shorter than one "
                    f"row of seq_len+1={row_len} tokens; use a smaller seq_len or more data"
                )
        end = pos + row_len - continued
        if end == stream.total or stream.is_bos(end):
            nxt = end  # the row ends exactly at a document boundary
        else:
            b = stream.last_bos_between(pos, end)
            if b < 0:
                nxt = end  # the row lies inside one long document: continue it in the next row
            else:
                doc_end = stream.next_bos(end)
                if doc_end - b > row_len:
                    nxt = end  # longer than a row: split it rather than drop its tail
                else:
                    nxt = doc_end  # crop the tail of the last document, next row starts at a BOS
                    cropped += doc_end - end
        return _Row(epoch, pos, end, continued), epoch, nxt, cropped


    def next_row_record28(self, epoch: int, pos: int, row_len: int) -> tuple[_Row, int, int, int]:
        """Record #28's rows (its find_batch_starts): a row starts at the first BOS at or after `pos`
        and is the next seq_len + 1 tokens, whatever documents they hold; the next row starts at the
        first BOS at least seq_len tokens after this row's start. What lies between is skipped: the
        tail of a document longer than a row, or of the document the row end cuts."""
        stream = self.stream(epoch)
        start = stream.next_bos(pos) if pos < stream.total else stream.total
        cropped = start - pos
        if start + row_len > stream.total:
            cropped += max(stream.total - start, 0)
            epoch += 1
            stream = self.stream(epoch)
            start = stream.next_bos(0)
            cropped += start
            if start + row_len > stream.total:
                raise ValueError(f"the data ({stream.total:,} tokens) holds no row of seq_len+1={row_len} tokens "
                                 f"starting at a BOS; use a smaller seq_len or more data")
        nxt = stream.next_bos(start + row_len - 1)
        return _Row(epoch, start, start + row_len, False), epoch, nxt, cropped + max(nxt - start - row_len, 0)

    def next_row_capped(self, epoch: int, pos: int, row_len: int, max_doc: int) -> tuple[list[tuple], int, int, int]:
        """A row of whole documents cut to at most `max_doc` tokens each (the later records' maximum
        document length): (pieces, next epoch, next position, tokens cropped). Every piece starts at a
        BOS; a document's tokens past `max_doc`, and those of the document the row's end cuts, are
        skipped, and the next row starts at the next document (record #29 on)."""
        pieces: list[tuple] = []
        filled = cropped = wraps = 0
        while filled < row_len:
            stream = self.stream(epoch)
            start = stream.next_bos(pos) if pos < stream.total else stream.total
            cropped += start - pos
            if start >= stream.total:  # the epoch is used up: the next pass begins
                epoch, pos, wraps = epoch + 1, 0, wraps + 1
                if wraps > 2:
                    raise ValueError(f"the data ({stream.total:,} tokens) cannot fill a row of {row_len} tokens from "
                                     f"documents cut to {max_doc} tokens (does it hold BOS tokens?); use more data")
                continue
            doc_end = stream.next_bos(start + 1)
            end = min(doc_end, start + max_doc, start + row_len - filled)
            pieces.append((epoch, start, end, False))
            filled += end - start
            cropped += doc_end - end
            pos = doc_end
        return pieces, epoch, pos, cropped

    def record28_step_start(self, epoch: int, pos: int, window: int) -> int:
        """Record #28's shard change, checked at each optimizer step's start: when the current shard has
        no more than `window` + 1 tokens left after `pos`, the step starts at the next shard."""
        stream = self.stream(epoch)
        if pos >= stream.total:
            return pos
        k = stream._locate(pos)
        lo, hi = int(stream.starts[k]), int(stream.starts[k + 1])
        return hi if pos - lo + window + 1 >= hi - lo else pos


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
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if packing not in PACKINGS:
            raise ValueError(f"packing={packing!r} must be one of {', '.join(PACKINGS)}")
        _check_shape(batch_size, seq_len)
        self.files = _resolve(files, "train")
        self.seq_len, self.batch_size = seq_len, batch_size
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.bos_id = bos_id
        self.seed = seed
        if on_bad_shard not in ("stop", "skip"):
            raise ValueError(f"on_bad_shard={on_bad_shard!r} must be 'stop' or 'skip'")
        if on_bad_shard == "skip" and packing == "bestfit":  # its buffered documents would need remapping too
            raise ValueError("on_bad_shard='skip' works with packing='greedy' only")
        self.on_bad_shard = on_bad_shard
        self._shards = _Shards(self.files, bos_id, lenient=on_bad_shard == "skip", vocab_size=vocab_size)
        self._planner = _Planner(self._shards, seed)
        self.packing = packing
        self._bestfit = BestFitPacker(self._planner, buffer_docs) if packing == "bestfit" else None
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
        return BestFitState(0, 0, ()) if self._bestfit else _GreedyState(0, 0)

    @property
    def epoch(self) -> int:
        """Completed passes over the data (counts up when a batch from the next pass is handed out;
        with best-fit packing, when the buffer starts reading the next pass)."""
        return self._state.epoch

    @property
    def cropped_share(self) -> float:
        """Of the data tokens consumed so far, the share cropped (never put into a row)."""
        st = self._state
        return st.cropped / (st.cropped + st.row_tokens) if st.row_tokens else 0.0

    def _default_epoch_notice(self, epoch: int) -> None:
        if self.rank == 0:
            warnings.warn(
                f"TokenLoader: starting epoch {epoch + 1}: all {self._shards.total:,} tokens in "
                f"{len(self._shards.files)} shards were used once more (data repeats from here on)",
                stacklevel=3,
            )

    def _plan(self, state, n_rows: int, row_len: int, max_doc: int = 0):
        """(rows, each a list of pieces (epoch, start, end, continued), and the state after them)."""
        if self._bestfit is not None:
            return self._bestfit.plan(state, n_rows, row_len)
        epoch, pos, cropped = state.epoch, state.pos, state.cropped
        next_row = self._planner.next_row_record28 if self.packing == "record28" else self._planner.next_row
        rows = []
        for _ in range(n_rows):
            if max_doc:
                pieces, epoch, pos, crop = self._planner.next_row_capped(epoch, pos, row_len, max_doc)
            else:
                row, epoch, pos, crop = next_row(epoch, pos, row_len)
                pieces = [(row.epoch, row.start, row.end, row.continued)]
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
                except _BadShardHit as hit:
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
            for epoch, start, end, continued in pieces:
                if continued:
                    buf[i, at] = self.bos_id
                    at += 1
                self._planner.stream(epoch).copy(start, end, buf[i, at : at + end - start])
                at += end - start
        return buf, state

    def _skip_shard(self, hit: _BadShardHit, state, skipped: dict[str, int]):
        """Report a bad shard, or leave it out of its epoch and every later one and return where the
        batch now starts: positions before it are unchanged, inside it move to what followed it,
        after it shift down by its size (the same mapping a resumed run's layout gives)."""
        path = self._shards.files[hit.index]
        where = f"at byte {hit.error.offset}" if hit.error.offset is not None else "(offset unknown)"
        if self.on_bad_shard != "skip":
            raise ShardError(f"bad training shard {path} {where}, met during training: {hit.error}; or set "
                             f"--data.on_bad_shard=skip to skip it and go on", offset=hit.error.offset) from None
        old = self._planner.stream(hit.epoch)
        k = int(np.flatnonzero(old.order == hit.index)[0])
        start, end = int(old.starts[k]), int(old.starts[k + 1])
        self._planner.exclude(hit.index, hit.epoch)
        pos = state.pos
        if hit.epoch == state.epoch and pos >= start:
            pos = start if pos < end else pos - (end - start)
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
        """inputs (B, T) int32 and targets (B, T) int64 on ``device``; every row's first input token is BOS.

        batch_size/seq_len may change between calls (batch-size and sequence-length schedules).
        ``max_doc_len`` > 0 (greedy packing): rows of whole documents, each cut to at most that many
        tokens (``_Planner.next_row_capped``); it may change between calls too.
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
                pos = self._planner.record28_step_start(st.epoch, st.pos, window)
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
            "row_tokens": st.row_tokens,
            "cropped": st.cropped,
            "skipped_shards": dict(self.skipped_shards),
        }
        if isinstance(st, BestFitState):
            out["buffer"] = st.to_dict()["buffer"]
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
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None
        self._micro = 0  # states are taken between optimizer steps
        counts = dict(row_tokens=int(state.get("row_tokens", 0)), cropped=int(state.get("cropped", 0)))
        if packing == "bestfit":
            self._state = BestFitState.from_dict({**state, **counts})
        else:
            self._state = _GreedyState(int(state["epoch"]), int(state["position"]), **counts)
        self.skipped_shards = dict(state.get("skipped_shards", {}))
        self._planner.excluded.clear()
        index = {f.name: i for i, f in enumerate(self._shards.files)}
        for name, epoch in self.skipped_shards.items():
            self._planner.exclude(index[name], int(epoch))
        self._planner._streams.clear()

    def close(self) -> None:
        """Stop the prefetch thread (also safe to skip: it exits with the process)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
            self._pending = None


def _check_shape(batch_size: int, seq_len: int) -> None:
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size={batch_size} and seq_len={seq_len} must both be >= 1")
