"""Exact-duplicate documents: the hashes of the texts a build has kept, at 8 bytes a document.

Tokenizing drops a document whose text equals one already kept (site-packages hold many vendored
copies of one file; web dumps repeat boilerplate pages): a repeated document is a second epoch of it
that looks like learning, and one on both sides of the train/val split scores memory, not skill.
Only exact copies count (the worker's 64-bit blake2b of the text, tokenize_pool.doc_hash); near
duplicates are kept. At 10M documents a false match (one unique document dropped) has odds ~3e-6.

The set is sorted numpy runs merged like a log-structured tree: a Python set of ints would cost
~70 bytes a document, 0.7 GB at 10M; this costs 8 and answers a chunk of documents in a few
vectorised binary searches per run (O(log n) runs).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class SeenHashes:
    """The 64-bit text hashes kept so far; ``first_seen`` marks which of a batch are new."""

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []  # sorted, disjoint; sizes shrink along the list

    def __len__(self) -> int:
        return sum(len(run) for run in self._runs)

    def first_seen(self, hashes: Sequence[int] | np.ndarray) -> np.ndarray:
        """A bool per hash: True for the first of its value in this batch that no earlier batch held;
        all of them are held from now on."""
        h = np.asarray(hashes, dtype=np.uint64)
        values, first = np.unique(h, return_index=True)
        new = np.ones(len(values), dtype=bool)
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, values), len(run) - 1)
            new &= run[at] != values
        keep = np.zeros(len(h), dtype=bool)
        keep[first[new]] = True
        self._push(values[new])
        return keep

    def _push(self, run: np.ndarray) -> None:
        if not len(run):
            return
        self._runs.append(run)
        # Merge while the newest run is at least half its neighbour: sizes stay geometric, so there
        # are O(log n) runs and each hash is re-sorted O(log n) times over a build.
        while len(self._runs) > 1 and 2 * len(self._runs[-1]) >= len(self._runs[-2]):
            newer, older = self._runs.pop(), self._runs.pop()
            self._runs.append(np.sort(np.concatenate([older, newer]), kind="stable"))
