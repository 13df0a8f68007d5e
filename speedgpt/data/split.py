"""Writing a tokenized corpus: documents into train and val shards (`Splitter`), each split's
documents into shards of bounded size (`ShardWriter`)."""

from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np

from ..atomic import sha256_file
from .shards import TokenizerStamp, write_shard


class ShardWriter:
    """Appends whole documents to ``{split}_NNNNNN.bin`` shards of at most shard_tokens tokens
    (a single document longer than that gets a shard of its own), each header recording `stamp`."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int, stamp: TokenizerStamp | None = None):
        self.out_dir, self.split, self.shard_tokens, self.stamp = out_dir, split, shard_tokens, stamp
        self.pending: list[np.ndarray] = []
        self.n_pending = 0
        self.shards: list[dict] = []
        self.documents = 0
        self.tokens = 0

    def add(self, doc: np.ndarray) -> None:
        if self.n_pending and self.n_pending + len(doc) > self.shard_tokens:
            self.flush()
        self.pending.append(doc)
        self.n_pending += len(doc)
        self.documents += 1
        self.tokens += len(doc)

    def flush(self) -> None:
        if not self.pending:
            return
        path = self.out_dir / f"{self.split}_{len(self.shards):06d}.bin"
        n = write_shard(path, np.concatenate(self.pending), tokenizer=self.stamp)
        self.shards.append({"file": path.name, "tokens": n, "sha256": sha256_file(path)})
        self.pending, self.n_pending = [], 0

    def summary(self) -> dict:
        return {"documents": self.documents, "tokens": self.tokens, "shards": self.shards}


class Splitter:
    """Sends each document to the train or the val shards, deterministically.

    By hash: a document whose text hash falls below ``val_fraction`` of the hash range is val. Or,
    with ``val_docs=N``, the N smallest-hash documents are val: a max-heap (negated hashes) keeps
    the N smallest seen so far, and a document pushed out goes to train right then. ``ensure_val``:
    while val is still empty, the documents of the smallest hash so far wait instead of going to train;
    they go to train once val gets a document, or to val at the end if none did. Several wait at once
    where documents share a split key (the pieces of one file, corpus.PythonSourceFiles): a file is val
    or train as a whole, fallback included."""

    def __init__(self, out_dir: Path, shard_tokens: int, n_sources: int, val_fraction: float,
                 val_docs: int | None, ensure_val: bool, stamp: TokenizerStamp | None = None):
        self.train = ShardWriter(out_dir, "train", shard_tokens, stamp)
        self.val = ShardWriter(out_dir, "val", shard_tokens, stamp)
        self.per_source = [{"documents": 0, "tokens": 0, "train_documents": 0, "val_documents": 0,
                            "duplicate_documents": 0, "duplicate_tokens": 0} for _ in range(n_sources)]
        self.threshold = int(val_fraction * 2**64)
        self.val_docs = val_docs
        self.ensure_val = ensure_val
        self.val_heap: list[tuple[int, int, int, np.ndarray]] = []
        self.held: tuple[int, list[tuple[int, np.ndarray]]] | None = None  # (hash, [(source, document)])

    def add(self, s: int, doc: np.ndarray, doc_hash: int, index: int) -> None:
        """Document number `index` (in input order) of source `s`."""
        stats = self.per_source[s]
        stats["documents"] += 1
        stats["tokens"] += len(doc)
        if self.val_docs is not None:
            item = (-doc_hash, index, s, doc)
            if len(self.val_heap) < self.val_docs:
                heapq.heappush(self.val_heap, item)
            elif self.val_docs and doc_hash < -self.val_heap[0][0]:
                _, _, s_out, doc_out = heapq.heapreplace(self.val_heap, item)
                _add(self.train, self.per_source[s_out], "train", doc_out)
            else:
                _add(self.train, stats, "train", doc)
        elif doc_hash < self.threshold:
            _add(self.val, stats, "val", doc)
            self._release_held("train")  # val has a document now: the held ones are train's
        elif self.ensure_val and not self.val.documents and self.held is not None and doc_hash == self.held[0]:
            self.held[1].append((s, doc))  # another piece of the held file
        elif self.ensure_val and not self.val.documents and (self.held is None or doc_hash < self.held[0]):
            self._release_held("train")
            self.held = (doc_hash, [(s, doc)])
        else:
            _add(self.train, stats, "train", doc)

    def _release_held(self, split: str) -> None:
        """The waiting documents go to `split`, in the order they came."""
        if self.held is not None:
            for s, doc in self.held[1]:
                _add(self.train if split == "train" else self.val, self.per_source[s], split, doc)
            self.held = None

    def duplicate(self, s: int, tokens: int) -> None:
        """Count a document of source `s` dropped as a copy of one already placed (it goes nowhere)."""
        self.per_source[s]["duplicate_documents"] += 1
        self.per_source[s]["duplicate_tokens"] += tokens

    def finish(self) -> bool:
        """Place the waiting documents and flush the shards; False when train got no document
        (everything fell in val under ensure_val)."""
        self._release_held("val")  # no document fell below val_fraction: the smallest hash is val
        if self.ensure_val and not self.train.documents:
            return False
        for _, _, s, doc in sorted(self.val_heap, key=lambda item: item[1]):  # val in input order
            _add(self.val, self.per_source[s], "val", doc)
        self.train.flush()
        self.val.flush()
        return True


def _add(writer: ShardWriter, stats: dict, split: str, doc: np.ndarray) -> None:
    writer.add(doc)
    stats[f"{split}_documents"] += 1
