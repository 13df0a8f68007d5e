"""Tokenize document sources into train/val shards plus a manifest.

Documents are read in order in this process, tokenized in chunks by a pool of worker
processes, and written back in input order, so the shards are byte-identical whatever
the worker count. The train/val split is decided per document by a stable hash of its
text (blake2b): the same document lands in the same split on every run and every
machine, and exact duplicates can never straddle the split.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from .corpus import JsonlFiles, ParquetFiles, Source, TextFiles, expand_paths, python_source_files
from .shards import write_shard
from .tokenizer import BOS_ID, GPT2_VOCAB_SIZE, get_tokenizer

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "speedgpt.tokenized/1"
_CHUNK_CHARS = 1 << 20  # ~1 MB of text per worker task: big enough to amortize IPC, small enough to balance
_CHUNK_DOCS = 512


class TokenizeError(ValueError):
    """A build that would produce nothing usable (no documents, or no val split when one was asked)."""


# ----------------------------------------------------------------------------- worker side


def _doc_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _encode_chunk(texts: list[str]) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(all tokens, per-document lengths, per-document hashes); each document is [BOS, *tokens]."""
    enc = get_tokenizer()
    # encode_to_numpy with no special tokens allowed or checked is encode_ordinary (a literal
    # "<|endoftext|>" stays text; tests pin this) but hands back a buffer instead of a list
    # of Python ints, which saves ~15% of the whole tokenization time.
    encoded = [enc.encode_to_numpy(t, allowed_special=set(), disallowed_special=()) for t in texts]
    lengths = np.fromiter((len(ids) + 1 for ids in encoded), dtype=np.int64, count=len(encoded))
    tokens = np.empty(int(lengths.sum()), dtype=np.uint16)
    pos = 0
    for ids in encoded:
        tokens[pos] = BOS_ID
        tokens[pos + 1 : pos + 1 + len(ids)] = ids
        pos += 1 + len(ids)
    return tokens, lengths, [_doc_hash(t) for t in texts]


def _init_worker() -> None:
    # Ctrl-C reaches the whole process group; the parent decides what an interrupt means and
    # shuts the pool down cleanly, so a worker must not die mid-task (its result would never come).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    get_tokenizer()  # build the BPE table once per process, before the first task


# ----------------------------------------------------------------------------- main side


def _chunks(sources: Sequence[Source]) -> Iterator[tuple[list[int], list[str]]]:
    """(source indices, texts) in input order, cut into ~_CHUNK_CHARS pieces."""
    idx: list[int] = []
    texts: list[str] = []
    chars = 0
    for s, source in enumerate(sources):
        for _, text in source.documents():
            idx.append(s)
            texts.append(text)
            chars += len(text)
            if chars >= _CHUNK_CHARS or len(texts) >= _CHUNK_DOCS:
                yield idx, texts
                idx, texts, chars = [], [], 0
    if texts:
        yield idx, texts


@contextmanager
def _ordered_results(chunks: Iterable, workers: int):
    """Yield (meta, _encode_chunk(texts)) in input order, with at most 2 * workers chunks in flight.

    Shutdown, also after an early stop (max_tokens) or an error in the consumer: stop submitting,
    wait for the chunks already submitted, then close() and join() the pool. Never terminate()
    with tasks in flight: Pool.terminate() drains the task pipe only while it holds data, so a
    task whose (~1 MB, larger than the pipe) write starts just after that drain blocks the pool's
    task-handler thread forever once the workers are killed, and terminate() waits on it forever.
    Once every submitted task has returned, the task handler is idle and the shutdown cannot block.
    """
    if workers <= 1:
        yield ((meta, _encode_chunk(texts)) for meta, texts in chunks)
        return
    # spawn, not fork: forking a multi-threaded parent (numpy's BLAS pool, torch, CUDA, a
    # prefetch thread) can deadlock the child on a lock held at fork time. Start-up costs
    # ~0.5 s per worker (plus re-importing the caller's main module), paid once per build.
    pool = mp.get_context("spawn").Pool(workers, initializer=_init_worker)
    pending: deque = deque()

    def gen():
        for meta, texts in chunks:
            pending.append((meta, pool.apply_async(_encode_chunk, (texts,))))
            if len(pending) >= 2 * workers:  # bounded: the input may be far larger than memory
                meta0, res = pending.popleft()
                yield meta0, res.get()
        while pending:
            meta0, res = pending.popleft()
            yield meta0, res.get()

    try:
        yield gen()
    finally:
        # At most 2 * workers chunks (a second or two of work) are still out: let them finish.
        while pending:
            pending.popleft()[1].wait()
        pool.close()
        pool.join()


class _ShardWriter:
    """Appends whole documents to ``{split}_NNNNNN.bin`` shards of at most shard_tokens tokens
    (a single document longer than that gets a shard of its own)."""

    def __init__(self, out_dir: Path, split: str, shard_tokens: int):
        self.out_dir, self.split, self.shard_tokens = out_dir, split, shard_tokens
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
        n = write_shard(path, np.concatenate(self.pending))
        self.shards.append({"file": path.name, "tokens": n, "sha256": _sha256(path)})
        self.pending, self.n_pending = [], 0

    def summary(self) -> dict:
        return {"documents": self.documents, "tokens": self.tokens, "shards": self.shards}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class _Progress:
    """A rich progress line with tokens and tokens/s; a no-op when disabled."""

    def __init__(self, enabled: bool, total: int | None, description: str):
        self.enabled = enabled
        self.start = time.perf_counter()
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn() if total else TextColumn(""),
                TextColumn("{task.completed:,.0f} tokens · {task.fields[docs]:,} docs · {task.fields[rate]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),  # stdout stays clean for the caller's output
            )
            self._task = self._bar.add_task(description, total=total, docs=0, rate="")
            self._bar.start()

    def update(self, tokens: int, docs: int) -> None:
        if self.enabled:
            rate = tokens / max(time.perf_counter() - self.start, 1e-9)
            self._bar.update(self._task, completed=tokens, docs=docs, rate=f"{rate / 1e6:.2f}M tok/s" if rate >= 1e5 else f"{rate / 1e3:.1f}K tok/s")

    def close(self) -> None:
        if self.enabled:
            self._bar.stop()


def _as_sources(sources: Source | Sequence[Source]) -> list[Source]:
    if isinstance(sources, Source):
        return [sources]
    sources = list(sources)
    if not sources or not all(isinstance(s, Source) for s in sources):
        raise TypeError("sources must be a Source or a non-empty list of Sources (see speedgpt.data.corpus)")
    return sources


def _clear_outputs(out_dir: Path) -> None:
    # The manifest goes first: its presence means "complete", so a crash from here on
    # leaves a directory that ensure_local_python_corpus() rebuilds rather than trusts.
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for pattern in ("train_[0-9]*.bin", "val_[0-9]*.bin"):
        for old in out_dir.glob(pattern):
            old.unlink()


def tokenize_corpus(
    sources: Source | Sequence[Source],
    out_dir: str | os.PathLike,
    *,
    val_fraction: float = 0.01,
    val_docs: int | None = None,
    shard_tokens: int = 100_000_000,
    workers: int | None = None,
    max_tokens: int | None = None,
    progress: bool = True,
    ensure_val: bool = False,
) -> dict:
    """Tokenize ``sources`` into ``out_dir/{train,val}_NNNNNN.bin`` and ``out_dir/manifest.json``.

    Split: a document goes to val when its text hash falls below ``val_fraction`` of the
    hash range; or, with ``val_docs=N``, the N documents with the smallest hashes are val.
    ``max_tokens`` stops after the document that reaches that many tokens (train + val).
    ``ensure_val`` (with ``val_fraction > 0``): when no document's hash falls below the fraction
    (small inputs), the document with the smallest hash goes to val, so there is always a val split.
    Raises TokenizeError when no document was read (naming why the inputs were skipped).
    ``workers`` defaults to the CPU count; results do not depend on it.
    Existing ``train_*.bin``, ``val_*.bin`` and ``manifest.json`` in ``out_dir`` are replaced.
    Returns the manifest (also written as JSON).
    """
    sources = _as_sources(sources)
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
    if val_docs is not None and val_docs < 0:
        raise ValueError(f"val_docs={val_docs} must be >= 0")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens={shard_tokens} must be >= 1")
    workers = max(1, os.cpu_count() or 1) if workers is None else max(1, int(workers))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _clear_outputs(out_dir)

    params = {
        "sources": [s.describe() for s in sources],
        "val_fraction": None if val_docs is not None else val_fraction,
        "val_docs": val_docs,
        "shard_tokens": shard_tokens,
        "max_tokens": max_tokens,
        "tokenizer": "gpt2",
        "format_version": 1,
    }
    train = _ShardWriter(out_dir, "train", shard_tokens)
    val = _ShardWriter(out_dir, "val", shard_tokens)
    per_source = [{"documents": 0, "tokens": 0, "train_documents": 0, "val_documents": 0} for _ in sources]
    threshold = int(val_fraction * 2**64)
    # val_docs: a max-heap (negated hashes) of the N smallest-hash documents seen so far; a
    # document pushed out goes to train right then, which keeps the output deterministic.
    val_heap: list[tuple[int, int, int, np.ndarray]] = []
    # ensure_val: while val is still empty, the smallest-hash document so far waits here instead of
    # going to train; it goes to train once val gets a document, or to val at the end if none did.
    held: tuple[int, int, np.ndarray] | None = None
    ensure_val = ensure_val and val_docs is None and val_fraction > 0
    total_tokens = 0
    n_docs = 0
    stopped_early = False
    start = time.perf_counter()
    bar = _Progress(progress, max_tokens, f"tokenizing ({workers} worker{'s' * (workers > 1)})")
    try:
        with _ordered_results(_chunks(sources), workers) as results:
            for source_idx, (tokens, lengths, hashes) in results:
                offsets = np.concatenate([[0], np.cumsum(lengths)])
                for j, s in enumerate(source_idx):
                    doc = tokens[offsets[j] : offsets[j + 1]]
                    stats = per_source[s]
                    stats["documents"] += 1
                    stats["tokens"] += len(doc)
                    if val_docs is None:
                        to_val = hashes[j] < threshold
                    else:
                        to_val = False
                        item = (-hashes[j], n_docs, s, doc)
                        if len(val_heap) < val_docs:
                            heapq.heappush(val_heap, item)
                        elif val_docs and hashes[j] < -val_heap[0][0]:
                            _, _, s_out, doc_out = heapq.heapreplace(val_heap, item)
                            _add(train, per_source[s_out], "train", doc_out)
                        else:
                            _add(train, stats, "train", doc)
                    if val_docs is None:
                        if to_val:
                            _add(val, stats, "val", doc)
                            if held is not None:  # val has a document now: the held one is train's
                                _add(train, per_source[held[1]], "train", held[2])
                                held = None
                        elif ensure_val and not val.documents and (held is None or hashes[j] < held[0]):
                            if held is not None:
                                _add(train, per_source[held[1]], "train", held[2])
                            held = (hashes[j], s, doc)
                        else:
                            _add(train, stats, "train", doc)
                    n_docs += 1
                    total_tokens += len(doc)
                    if max_tokens is not None and total_tokens >= max_tokens:
                        stopped_early = True
                        break
                bar.update(total_tokens, n_docs)
                if stopped_early:
                    break
    finally:
        bar.close()
    problem = _nothing_usable(sources, n_docs, ensure_val)
    if problem:
        _clear_outputs(out_dir)  # no partial build left behind to be mistaken for data
        raise TokenizeError(problem)
    if held is not None:  # no document fell below val_fraction: the smallest hash is val
        _add(val, per_source[held[1]], "val", held[2])
    if ensure_val and not train.documents:
        _clear_outputs(out_dir)
        raise TokenizeError(f"all {n_docs:,} documents fell in the val split (val_fraction={val_fraction}); "
                            "use a smaller --val-fraction or add inputs")
    for _, _, s, doc in sorted(val_heap, key=lambda item: item[1]):  # val in input order
        _add(val, per_source[s], "val", doc)
    train.flush()
    val.flush()
    elapsed = time.perf_counter() - start

    manifest = {
        "format": MANIFEST_FORMAT,
        "params": params,
        "tokenizer": {"name": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "bos_id": BOS_ID},
        "sources": [
            {**s.describe(), **stats, "skipped": s.skipped.to_dict(), "skipped_total": s.skipped.total()}
            for s, stats in zip(sources, per_source)
        ],
        "documents": n_docs,
        "tokens": total_tokens,
        "stopped_early": stopped_early,
        "train": train.summary(),
        "val": val.summary(),
        # Everything above is a function of the inputs; "build" is not (time, machine).
        "build": {"workers": workers, "seconds": round(elapsed, 3), "tokens_per_s": round(total_tokens / max(elapsed, 1e-9))},
    }
    if stopped_early:
        manifest["note"] = f"stopped at max_tokens={max_tokens:,}: documents after that were not read"
    _write_json(out_dir / MANIFEST, manifest)
    return manifest


def _nothing_usable(sources: list[Source], n_docs: int, ensure_val: bool) -> str | None:
    """Why a build with ``n_docs`` documents is useless, or None when it is fine."""
    if n_docs >= 2 or (n_docs == 1 and not ensure_val):
        return None
    skipped = _skip_summary(sources)
    if n_docs == 0:
        return "no documents read from the inputs" + (f": every item was skipped ({skipped})" if skipped else "")
    return ("only 1 document read: a val split needs at least 2; add inputs or pass --val-fraction 0 "
            "(then give training its own val shards with --data.val_files)")


def _skip_summary(sources: list[Source], examples: int = 1) -> str:
    """'not UTF-8: 2 (e.g. a.bin), binary (NUL bytes): 1 (e.g. b.png)' over all sources."""
    counts: dict[str, int] = {}
    seen: dict[str, list[str]] = {}
    for source in sources:
        for reason, n in source.skipped.counts.items():
            counts[reason] = counts.get(reason, 0) + n
            seen.setdefault(reason, []).extend(source.skipped.examples.get(reason, []))
    return ", ".join(f"{reason}: {n:,} (e.g. {', '.join(seen[reason][:examples])})"
                     for reason, n in sorted(counts.items()))


def summary_text(manifest: dict, out_dir: str | os.PathLike) -> str:
    """A few human lines about a build: documents, tokens, shards per split, skipped items."""
    def split(name: str) -> str:
        part = manifest[name]
        n = len(part["shards"])
        docs = part["documents"]
        return (f"{name} {docs:,} doc{'s' * (docs != 1)} / {part['tokens']:,} tokens in "
                f"{n} shard{'s' * (n != 1)}")

    lines = [f"tokenized {manifest['documents']:,} documents, {manifest['tokens']:,} tokens -> {out_dir}",
             f"  {split('train')}; {split('val')}"]
    skipped: dict[str, tuple[int, list[str]]] = {}
    for source in manifest["sources"]:
        for reason, info in source.get("skipped", {}).items():
            n, ex = skipped.get(reason, (0, []))
            skipped[reason] = (n + info["count"], ex + info["examples"])
    for reason, (n, ex) in sorted(skipped.items()):
        lines.append(f"  skipped {n:,} {'item' if n == 1 else 'items'}: {reason} (e.g. {ex[0]})")
    if manifest.get("note"):
        lines.append(f"  note: {manifest['note']}")
    return "\n".join(lines)


def _add(writer: _ShardWriter, stats: dict, split: str, doc: np.ndarray) -> None:
    writer.add(doc)
    stats[f"{split}_documents"] += 1


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(out_dir: str | os.PathLike) -> dict | None:
    """The manifest in ``out_dir``, or None when missing or unreadable."""
    try:
        with open(Path(out_dir) / MANIFEST) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    return manifest if manifest.get("format") == MANIFEST_FORMAT else None


def sources_from_paths(paths: str | os.PathLike | Sequence, *, text_field: str = "text") -> list[Source]:
    """Pick a source per file by suffix: ``.jsonl[.gz]`` → JSONL, ``.parquet`` → Parquet, else text files.

    A directory or glob holding several kinds gives one source per kind (text, then JSONL, then
    Parquet); one holding a single kind stays one source named by the path as given.
    ``text_field`` names the JSONL field / Parquet column that holds the text.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    sources: list[Source] = []
    for p in map(str, paths):
        by_kind: dict[str, list[str]] = {"text": [], "jsonl": [], "parquet": []}
        for f in expand_paths(p):
            by_kind[_kind_of(f.name)].append(str(f))
        kinds = [k for k, files in by_kind.items() if files]
        for kind in kinds:
            where = p if len(kinds) == 1 else by_kind[kind]
            if kind == "jsonl":
                sources.append(JsonlFiles(where, text_field=text_field))
            elif kind == "parquet":
                sources.append(ParquetFiles(where, text_column=text_field))
            else:
                sources.append(TextFiles(where))
    return sources


def _kind_of(name: str) -> str:
    if name.endswith((".jsonl", ".jsonl.gz", ".json")):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else "text"


def tokenize_files(
    inputs: str | os.PathLike | Sequence,
    out_dir: str | os.PathLike,
    *,
    text_field: str = "text",
    val_fraction: float = 0.01,
    val_docs: int | None = None,
    shard_tokens: int = 100_000_000,
    workers: int | None = None,
    max_tokens: int | None = None,
    progress: bool = True,
) -> dict:
    """``speedgpt data tokenize``: tokenize text/JSONL/Parquet files or globs into ``out_dir``.

    Unlike tokenize_corpus's default, a val split is always made when ``val_fraction > 0`` (at
    least one document), so the shards can be trained on as they are.
    """
    return tokenize_corpus(
        sources_from_paths(inputs, text_field=text_field),
        out_dir,
        val_fraction=val_fraction,
        val_docs=val_docs,
        shard_tokens=shard_tokens,
        workers=workers,
        max_tokens=max_tokens,
        progress=progress,
        ensure_val=True,
    )


@contextmanager
def _dir_lock(out_dir: Path):
    """Serialize builds of one directory across processes (e.g. every rank of a torchrun job)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): single-process use only
        yield
        return
    with open(out_dir / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_local_python_corpus(
    out_dir: str | os.PathLike,
    max_tokens: int = 20_000_000,
    *,
    val_fraction: float = 0.01,
    shard_tokens: int = 100_000_000,
    workers: int | None = None,
    progress: bool = True,
) -> dict:
    """The default training data: this interpreter's stdlib + site-packages ``.py`` files.

    Builds it into ``out_dir`` unless ``out_dir/manifest.json`` exists and was built with
    the same parameters (same sources, Python version, max_tokens, split, shard size),
    in which case it is reused. Safe to call from every rank at once (a file lock makes
    one build and the others reuse it). Returns the manifest.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _dir_lock(out_dir):
        source = python_source_files()
        wanted = {
            "sources": [source.describe()],
            "val_fraction": val_fraction,
            "val_docs": None,
            "shard_tokens": shard_tokens,
            "max_tokens": max_tokens,
            "tokenizer": "gpt2",
            "format_version": 1,
        }
        manifest = read_manifest(out_dir)
        if manifest is not None and manifest["params"] == wanted and _outputs_present(out_dir, manifest):
            return manifest
        if progress:
            print(f"speedgpt: building the local Python-source corpus in {out_dir} ({f'max {max_tokens:,} tokens' if max_tokens else 'all files'})", file=sys.stderr)
        return tokenize_corpus(
            [source], out_dir, val_fraction=val_fraction, shard_tokens=shard_tokens,
            workers=workers, max_tokens=max_tokens, progress=progress,
        )


def _outputs_present(out_dir: Path, manifest: dict) -> bool:
    # A size check (not a hash) is enough to notice deleted or truncated shards cheaply.
    from .shards import HEADER_BYTES, TOKEN_BYTES

    for split in ("train", "val"):
        for shard in manifest[split]["shards"]:
            path = out_dir / shard["file"]
            if not path.is_file() or path.stat().st_size != HEADER_BYTES + TOKEN_BYTES * shard["tokens"]:
                return False
    return True
