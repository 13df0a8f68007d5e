"""Token shards seen as one stream per epoch: what the row planners read.

An epoch's stream is a sequence of *segments*, each a span of one shard. Epoch 0 is the shards in
the given order (the speedrun reads its shards in order), or shuffled as a later epoch is with
``shuffle_first``. A later epoch shuffles, so that repeated
data is not met in the same sequence: by default its *documents* are shuffled (``shuffle="docs"``),
within groups of shards that fit ``SHUFFLE_GROUP_TOKENS`` (one group for any corpus below that size,
so a 175M-token corpus is shuffled as a whole); ``shuffle="shards"`` permutes whole shards only
(record #28's loader, whose shard changes follow the shard layout). Both are pure functions of
``(seed, epoch)``, so a resumed run plans the same rows.

A segment starts at a document start, except the headless fragment a shard may begin with (a
FineWeb shard can start mid-document): the planners see a position that is not a BOS as a
continuation and treat it as they treat the rest of a split document.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .shards import ShardError, claimed_tokens, load_shard, read_header

SHUFFLES = ("docs", "shards")
# Documents are shuffled across all shards of a group; a group's shards stay loaded while it is read
# (random documents from them), so this bounds a rank's host memory: 2^29 uint16 tokens = 1 GiB.
SHUFFLE_GROUP_TOKENS = 2**29


class BadShardHit(Exception):
    """Loading shard `index` failed while planning `epoch`'s stream (the loader decides what follows)."""

    def __init__(self, index: int, epoch: int, error: ShardError):
        super().__init__(str(error))
        self.index, self.epoch, self.error = index, epoch, error


class ShardCache:
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
        self.capacity = capacity
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._doc_starts: dict[int, np.ndarray] = {}  # shard -> its segment starts (small: one int per document)
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
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return tokens, bos

    def doc_starts(self, i: int) -> np.ndarray:
        """Where shard i's documents start (its BOS positions, and 0 when it begins with a fragment);
        kept for the run once read, so shuffled epochs need not reload shards to lay out their streams."""
        starts = self._doc_starts.get(i)
        if starts is None:
            _, bos = self.get(i)
            starts = bos if len(bos) and bos[0] == 0 else np.concatenate([[0], bos]).astype(np.int64)
            self._doc_starts[i] = starts
        return starts


class EpochStream:
    """One epoch's segments (spans of shards) seen as one token stream."""

    def __init__(self, shards: ShardCache, seg_shard: np.ndarray, seg_lo: np.ndarray, seg_hi: np.ndarray,
                 epoch: int = 0):
        self.shards, self.epoch = shards, epoch
        self.seg_shard, self.seg_lo = seg_shard.astype(np.int64), seg_lo.astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(seg_hi - seg_lo)]).astype(np.int64)
        self.total = int(self.starts[-1])

    @property
    def order(self) -> list[int]:
        """The shards in the order the stream first enters each."""
        return list(dict.fromkeys(int(i) for i in self.seg_shard))

    def _locate(self, g: int) -> int:
        return int(np.searchsorted(self.starts, g, side="right")) - 1

    def _shard(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self.shards.get(int(self.seg_shard[k]))
        except ShardError as e:
            raise BadShardHit(int(self.seg_shard[k]), self.epoch, e) from None

    def is_bos(self, g: int) -> bool:
        k = self._locate(g)
        return bool(self._shard(k)[0][self.seg_lo[k] + g - self.starts[k]] == self.shards.bos_id)

    def last_bos_between(self, lo: int, hi: int) -> int:
        """The last BOS position b with lo < b < hi, or -1."""
        k = self._locate(hi - 1)
        while k >= 0 and self.starts[k + 1] > lo + 1:
            _, bos = self._shard(k)
            a = int(self.seg_lo[k])
            j = int(np.searchsorted(bos, a + min(hi, self.starts[k + 1]) - self.starts[k], side="left")) - 1
            if j >= 0 and bos[j] >= a:
                b = int(self.starts[k] + bos[j] - a)
                return b if b > lo else -1
            k -= 1
        return -1

    def next_bos(self, g: int) -> int:
        """The first BOS position >= g, or the stream's end."""
        k = self._locate(g)
        while k < len(self.seg_shard):
            _, bos = self._shard(k)
            a = int(self.seg_lo[k])
            j = int(np.searchsorted(bos, a + max(g - self.starts[k], 0), side="left"))
            if j < len(bos) and bos[j] < a + self.starts[k + 1] - self.starts[k]:
                return int(self.starts[k] + bos[j] - a)
            k += 1
        return self.total

    def bos_from(self, g: int, n: int) -> np.ndarray:
        """Up to `n` BOS positions >= g in order (fewer at the stream's end): many next_bos at once."""
        out, found, k = [], 0, self._locate(g)
        while k < len(self.seg_shard) and found < n:
            _, bos = self._shard(k)
            a, size = int(self.seg_lo[k]), int(self.starts[k + 1] - self.starts[k])
            j = int(np.searchsorted(bos, a + max(g - self.starts[k], 0), side="left"))
            stop = min(int(np.searchsorted(bos, a + size, side="left")), j + n - found)
            out.append(bos[j:stop] - a + self.starts[k])
            found += stop - j
            k += 1
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def copy(self, start: int, end: int, out: np.ndarray) -> None:
        """out[:] = stream[start:end] (may span segments)."""
        k = self._locate(start)
        filled = 0
        while start + filled < end:
            tokens, _ = self._shard(k)
            lo = int(self.seg_lo[k] + start + filled - self.starts[k])
            n = min(end - start - filled, int(self.seg_lo[k] + self.starts[k + 1] - self.starts[k]) - lo)
            out[filled : filled + n] = tokens[lo : lo + n]
            filled += n
            k += 1

    def spans_of(self, shard: int) -> list[tuple[int, int]]:
        """The stream ranges [start, end) that come from `shard`."""
        ks = np.flatnonzero(self.seg_shard == shard)
        return [(int(self.starts[k]), int(self.starts[k + 1])) for k in ks]



def position_without(spans: list[tuple[int, int]], pos: int) -> int:
    """Where stream position `pos` lands once `spans` are taken out of the stream: positions inside a
    span move to what followed it, later ones shift down by the sizes of the spans before them."""
    return pos - sum(min(pos, e) - s for s, e in spans if s < pos)


class EpochStreams:
    """Each epoch's stream, built on demand (the last two are kept), minus the bad shards left out."""

    def __init__(self, shards: ShardCache, seed: int, shuffle: str = "docs",
                 group_tokens: int = SHUFFLE_GROUP_TOKENS, shuffle_first: bool = False):
        if shuffle not in SHUFFLES:
            raise ValueError(f"shuffle={shuffle!r} must be one of {', '.join(SHUFFLES)}")
        self.shards, self.seed, self.shuffle, self.group_tokens = shards, seed, shuffle, group_tokens
        self.shuffle_first = shuffle_first  # epoch 0 is shuffled too (data.shuffle_first_epoch)
        self._streams: OrderedDict[int, EpochStream] = OrderedDict()
        self.excluded: dict[int, int] = {}  # bad shard index -> first epoch whose stream leaves it out

    def exclude(self, index: int, from_epoch: int) -> None:
        self.excluded[index] = from_epoch
        self._streams.clear()

    def clear(self) -> None:
        self._streams.clear()

    def stream(self, epoch: int) -> EpochStream:
        s = self._streams.get(epoch)
        if s is None:
            s = self._streams[epoch] = self._build(epoch)
            while len(self._streams) > 2:
                self._streams.popitem(last=False)
        return s

    def _build(self, epoch: int) -> EpochStream:
        n = len(self.shards.files)
        # Order and groups come from all shards, and a shard's documents get their own random sort keys,
        # so leaving a bad shard out only takes its spans out of the stream: the rest keeps its order,
        # which is what TokenLoader's position remapping (and a resumed run's layout) relies on.
        in_order = epoch == 0 and not self.shuffle_first
        order = np.arange(n) if in_order else np.random.default_rng([self.seed, epoch]).permutation(n)
        groups = [[i for i in g if self.excluded.get(i, epoch + 1) > epoch] for g in self._groups(order)]
        if not any(groups):
            raise ShardError(f"every training shard is bad ({len(self.excluded)} skipped); re-create the data")
        sizes = self.shards.sizes
        if in_order or self.shuffle == "shards":
            whole = np.array([i for g in groups for i in g], dtype=np.int64)
            return EpochStream(self.shards, whole, np.zeros(len(whole), np.int64), sizes[whole], epoch)
        ids, los, his = [], [], []
        for group in filter(None, groups):
            g_ids, g_lo, g_hi, g_keys = [], [], [], []
            for i in group:
                try:
                    starts = self.shards.doc_starts(i)
                except ShardError as e:
                    raise BadShardHit(i, epoch, e) from None
                g_ids.append(np.full(len(starts), i, np.int64))
                g_lo.append(starts)
                g_hi.append(np.append(starts[1:], sizes[i]))
                g_keys.append(np.random.default_rng([self.seed, epoch, i]).random(len(starts)))
            perm = np.argsort(np.concatenate(g_keys), kind="stable")
            for out, part in ((ids, g_ids), (los, g_lo), (his, g_hi)):
                out.append(np.concatenate(part)[perm])
        # The group being read keeps all its shards loaded: random documents come from any of them.
        self.shards.capacity = max(self.shards.capacity, max(len(g) for g in groups) + 1)
        return EpochStream(self.shards, np.concatenate(ids), np.concatenate(los), np.concatenate(his), epoch)

    def _groups(self, order: np.ndarray) -> list[list[int]]:
        """Consecutive shards of `order` in groups of at most group_tokens tokens (a larger shard alone)."""
        groups: list[list[int]] = [[]]
        tokens = 0
        for i in map(int, order):
            size = int(self.shards.sizes[i])
            if groups[-1] and tokens + size > self.group_tokens:
                groups.append([])
                tokens = 0
            groups[-1].append(i)
            tokens += size
        return groups
