"""Tokenize document sources into train/val shards plus a manifest.

Documents are read in order in this process, tokenized in chunks by a pool of worker
processes (tokenize_pool.py), and written back in input order, so the shards are byte-identical whatever
the worker count. A document whose text equals one already kept is dropped and counted (dedupe.py).
The train/val split is decided per document by a stable hash of its text (blake2b): the same
document lands in the same split on every run and every machine.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..atomic import atomic_write
from .corpus import (MISSING_FIELD, JsonlFiles, ParquetFiles, Source, TextFiles, expand_paths,
                     python_source_files)
from .dedupe import SeenHashes
from .shards import OWN_VAL_SHARDS
from .split import Splitter
from .tokenize_pool import TokenizeError, WorkerDied, document_chunks, ordered_results
from .tokenizer import BOS_ID, GPT2_VOCAB_SIZE

if TYPE_CHECKING:
    from ..tokenizer.core import Tokenizer

MANIFEST = "manifest.json"
BUILD_SUBDIR = ".tokenizing"  # where a build writes its shards until it has succeeded
DIR_LOCK = ".lock"  # ensure_local_python_corpus's lock (_dir_lock), held around a build's (building_into)
MANIFEST_FORMAT = "speedgpt.tokenized/1"
# The local corpus in pieces validates on whole files (corpus.PythonSourceFiles): 1% of a 5M-token
# build is about 6 files, too few for a val loss that does not hang on which files they are.
LOCAL_VAL_FRACTION_PIECES = 0.05


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


def _clear_outputs(out_dir: Path, keep: Path | None = None) -> None:
    # The manifest goes first: its presence means "complete", so a crash from here on
    # leaves a directory that ensure_local_python_corpus() rebuilds rather than trusts.
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for pattern in ("train_[0-9]*.bin", "val_[0-9]*.bin"):
        for old in out_dir.glob(pattern):
            old.unlink()
    # The copy of the old shards' tokenizer goes with them (unless it is the one tokenizing now).
    from ..tokenizer.folder import RUN_SUBDIR, is_tokenizer_folder

    copy = out_dir / RUN_SUBDIR
    if is_tokenizer_folder(copy) and (keep is None or copy.resolve() != keep.resolve()):
        shutil.rmtree(copy)


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
    tokenizer: Tokenizer | None = None,
    dedupe: bool = True,
) -> dict:
    """Tokenize ``sources`` into ``out_dir/{train,val}_NNNNNN.bin`` and ``out_dir/manifest.json``.

    Split: a document goes to val when its text hash falls below ``val_fraction`` of the
    hash range; or, with ``val_docs=N``, the N documents with the smallest hashes are val.
    ``max_tokens`` stops after the document that reaches that many tokens (train + val).
    ``dedupe``: a document whose text equals an earlier kept one is dropped (counted in the manifest's
    "duplicates"; documents and tokens count what was kept); False keeps every copy.
    ``ensure_val`` (with ``val_fraction > 0``): when no document's hash falls below the fraction
    (small inputs), the document with the smallest hash goes to val, so there is always a val split.
    Raises TokenizeError when no document was read (naming why the inputs were skipped).
    ``workers`` defaults to the CPU count; results do not depend on it.
    ``tokenizer``: a trained tokenizer (speedgpt.tokenizer), recorded in every shard header and copied
    to ``out_dir/tokenizer/`` so the shards carry it; None: GPT-2's.
    Existing ``train_*.bin``, ``val_*.bin``, ``manifest.json`` and ``tokenizer/`` in ``out_dir`` are
    replaced, but only by a build that succeeded: the new shards are written in ``out_dir/.tokenizing``
    first (so the disk holds both for a while), and a build that fails leaves the old ones as they were.
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
    ensure_val = ensure_val and val_docs is None and val_fraction > 0  # (what the build does, as its manifest says)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from ..tokenizer.folder import RUN_SUBDIR, copy_folder
    from ..tokenizer.shards import GPT2_STAMP, stamp_of

    if tokenizer is not None and tokenizer.folder is None:  # GPT-2's, given explicitly
        tokenizer = None
    with building_into(out_dir):
        keep = tokenizer.folder if tokenizer is not None else None
        # The new build goes to a folder of its own; a previous one's, left by a killed process, is partial.
        build_dir = out_dir / BUILD_SUBDIR
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir()
        stamp = stamp_of(tokenizer) if tokenizer is not None else GPT2_STAMP

        params = {
            "sources": [s.describe() for s in sources],
            "val_fraction": None if val_docs is not None else val_fraction,
            "val_docs": val_docs,
            "shard_tokens": shard_tokens,
            "max_tokens": max_tokens,
            "tokenizer": "gpt2" if tokenizer is None else {"name": tokenizer.name, "sha256": tokenizer.sha256},
            "format_version": 1 if stamp.vocab_size <= 2**16 else 2,
            "dedupe": "exact" if dedupe else "none",
            "ensure_val": ensure_val,
        }
        split = Splitter(build_dir, shard_tokens, len(sources), val_fraction, val_docs, ensure_val, stamp)
        total_tokens = 0
        n_docs = 0
        seen = SeenHashes() if dedupe else None
        stopped_early = False
        start = time.perf_counter()
        bar = _Progress(progress, max_tokens, f"tokenizing ({workers} worker{'s' * (workers > 1)})")
        try:
            try:
                with ordered_results(document_chunks(sources), workers, tokenizer) as results:
                    for (source_idx, keys), (tokens, lengths, hashes) in results:
                        offsets = np.concatenate([[0], np.cumsum(lengths)])
                        # The text's own hash decides (not the split key: two files may share a piece).
                        new = seen.first_seen(hashes) if seen is not None else np.ones(len(hashes), dtype=bool)
                        for j, s in enumerate(source_idx):
                            doc = tokens[offsets[j] : offsets[j + 1]]
                            if not new[j]:
                                split.duplicate(s, len(doc))
                                continue
                            # The text's hash, or its source's split key (every piece of one file alike)
                            split.add(s, doc, hashes[j] if keys[j] is None else keys[j], n_docs)
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
            duplicates = {k: sum(p[f"duplicate_{k}"] for p in split.per_source) for k in ("documents", "tokens")}
            problem = _nothing_usable(sources, n_docs, split.ensure_val, duplicates["documents"],
                                      max_tokens if stopped_early else None)
            if problem:
                raise TokenizeError(problem)
            if not split.finish():  # (pieces of one file all wait for val: corpus.PythonSourceFiles)
                fix = RAISE_MAX_TOKENS if stopped_early else "use a smaller --val-fraction or add inputs"
                raise TokenizeError(f"all {n_docs:,} documents fell in the val split (val_fraction={val_fraction}); "
                                    f"{fix}")
        except BaseException:  # a failed or interrupted build (WorkerDied too): its shards go, the earlier ones stay
            shutil.rmtree(build_dir, ignore_errors=True)
            raise
        train, val, per_source = split.train, split.val, split.per_source
        elapsed = time.perf_counter() - start

        manifest = {
            "format": MANIFEST_FORMAT,
            "params": params,
            "tokenizer": {"name": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "bos_id": BOS_ID} if tokenizer is None else
                         {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size, "bos_id": tokenizer.bos_id,
                          "sha256": tokenizer.sha256, "folder": RUN_SUBDIR},
            "sources": [
                {**s.describe(), **stats, "skipped": s.skipped.to_dict(), "skipped_total": s.skipped.total()}
                for s, stats in zip(sources, per_source)
            ],
            "documents": n_docs,
            "tokens": total_tokens,
            "duplicates": duplicates,  # exact copies of a kept document's text, dropped (not in the counts above)
            "stopped_early": stopped_early,
            "train": train.summary(),
            "val": val.summary(),
            # Everything above is a function of the inputs; "build" is not (time, machine).
            "build": {"workers": workers, "seconds": round(elapsed, 3), "tokens_per_s": round(total_tokens / max(elapsed, 1e-9))},
        }
        if stopped_early:
            manifest["note"] = f"stopped at max_tokens={max_tokens:,}: documents after that were not read"
        if tokenizer is not None and (out_dir / RUN_SUBDIR).resolve() != tokenizer.folder.resolve():
            copy_folder(tokenizer, build_dir / RUN_SUBDIR)  # the shards carry their tokenizer (training finds it there)
        _clear_outputs(out_dir, keep)
        for built in build_dir.iterdir():  # renames within one folder: the shards and the tokenizer copy
            built.replace(out_dir / built.name)
        build_dir.rmdir()
        _write_json(out_dir / MANIFEST, manifest)  # last: its presence means the folder is complete
        return manifest


@contextmanager
def building_into(out_dir: Path):
    """Holds `out_dir`'s build lock (a file beside the shards, filelock's, freed by the OS if the process dies), so
    a second build into the same folder fails at once instead of deleting the first one's shards as it starts."""
    from filelock import FileLock, Timeout

    path = out_dir / f"{BUILD_SUBDIR}.lock"
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise TokenizeError(f"another `speedgpt data` build is writing into {out_dir} right now; wait for it to "
                            "finish or give another --out") from None
    try:
        yield
    finally:
        try:
            _drop_if_alone(path)
        finally:
            lock.release()


def _drop_if_alone(path: Path) -> None:
    """Delete lock file `path`, still held, when its folder holds nothing but build locks: a failed first build, whose
    command then removes the folder it made (commands/data.py; a lock file left there kept it, looking half-built).
    Held while deleted: a process waiting on it finds the file gone once it has the lock (filelock>=4) and locks a new
    one. Beside shards the file stays."""
    try:
        if {f.name for f in path.parent.iterdir()} <= {DIR_LOCK, f"{BUILD_SUBDIR}.lock"}:
            path.unlink(missing_ok=True)
    except OSError:  # the folder gone, or unreadable: the lock stays, and the build's own error is the one raised
        pass


RAISE_MAX_TOKENS = "raise --max-tokens (for train's default corpus: data.local_max_tokens)"


def _nothing_usable(sources: list[Source], n_docs: int, ensure_val: bool, duplicates: int = 0,
                    stopped_at: int | None = None) -> str | None:
    """Why a build with ``n_docs`` documents (after dropping ``duplicates``) is useless, or None when it is fine;
    ``stopped_at``: the max_tokens that ended the build early (None: every input was read)."""
    if n_docs >= 2 or (n_docs == 1 and not ensure_val):
        return None
    skipped = _skip_summary(sources)
    if n_docs == 0:
        hint = ("; name the field that holds the text with --text-field"
                if any(r.startswith(MISSING_FIELD) for s in sources for r in s.skipped.counts) else "")
        return "no documents read from the inputs" + (f": every item was skipped ({skipped})" if skipped else "") + hint
    copies = f" (and {duplicates:,} exact copies of it, dropped)" if duplicates else ""
    if stopped_at is not None:  # more input was there: reading on gives the second document
        return (f"only 1 distinct document read{copies} before max_tokens={stopped_at:,} stopped the build: a val "
                f"split needs at least 2; {RAISE_MAX_TOKENS}")
    return (f"only 1 distinct document read{copies}: a val split needs at least 2; add inputs or pass --val-fraction 0 "
            f"(then {OWN_VAL_SHARDS})")


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
    tok = manifest.get("tokenizer", {})
    if tok.get("folder"):  # a trained tokenizer, copied next to the shards
        lines.append(f"  tokenizer {tok['name']} (vocab {tok['vocab_size']:,}) copied to "
                     f"{Path(out_dir) / tok['folder']}")
    skipped: dict[str, tuple[int, list[str]]] = {}
    for source in manifest["sources"]:
        for reason, info in source.get("skipped", {}).items():
            n, ex = skipped.get(reason, (0, []))
            skipped[reason] = (n + info["count"], ex + info["examples"])
    for reason, (n, ex) in sorted(skipped.items()):
        lines.append(f"  skipped {n:,} {'item' if n == 1 else 'items'}: {reason} (e.g. {ex[0]})")
    dup = manifest.get("duplicates", {})
    if dup.get("documents"):
        lines.append(f"  dropped {dup['documents']:,} duplicate document{'s' * (dup['documents'] != 1)} "
                     f"({dup['tokens']:,} tokens): exact copies of a kept one")
    if manifest.get("note"):
        lines.append(f"  note: {manifest['note']}")
    return "\n".join(lines)


def _write_json(path: Path, obj: dict) -> None:
    atomic_write(path, json.dumps(obj, indent=1) + "\n")


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
    tokenizer: Tokenizer | None = None,
    dedupe: bool = True,
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
        tokenizer=tokenizer,
        dedupe=dedupe,
    )


@contextmanager
def _dir_lock(out_dir: Path):
    """Serialize builds of one directory across processes (e.g. every rank of a torchrun job): the later ones wait,
    then find the first one's build and reuse it. A failed first build leaves no lock file (_drop_if_alone)."""
    from filelock import FileLock

    path = out_dir / DIR_LOCK
    with FileLock(path):
        try:
            yield
        finally:
            _drop_if_alone(path)


def ensure_local_python_corpus(
    out_dir: str | os.PathLike,
    max_tokens: int = 20_000_000,
    *,
    piece_chars: int = 0,
    val_fraction: float | None = None,
    shard_tokens: int = 100_000_000,
    workers: int | None = None,
    progress: bool = True,
) -> dict:
    """The default training data: this interpreter's stdlib + site-packages ``.py`` files (one document
    per file, or shuffled pieces of about ``piece_chars`` characters: corpus.PythonSourceFiles).

    Builds it into ``out_dir`` unless ``out_dir/manifest.json`` exists and was built with
    the same parameters (same sources, Python version, max_tokens, split, shard size),
    in which case it is reused. Safe to call from every rank at once (a file lock makes
    one build and the others reuse it). Returns the manifest.
    """
    if val_fraction is None:  # pieces take val by whole file: 5% of the files, so validation scores many
        val_fraction = LOCAL_VAL_FRACTION_PIECES if piece_chars else 0.01
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _dir_lock(out_dir):
        source = python_source_files(piece_chars)
        wanted = {
            "sources": [source.describe()],
            "val_fraction": val_fraction,
            "val_docs": None,
            "shard_tokens": shard_tokens,
            "max_tokens": max_tokens,
            "tokenizer": "gpt2",
            "format_version": 1,
            "dedupe": "exact",  # builds from before duplicates were dropped are rebuilt
            "ensure_val": True,  # and those from before a small build had a val file (its train order differs)
        }
        manifest = read_manifest(out_dir)
        if manifest is not None and manifest["params"] == wanted and _outputs_present(out_dir, manifest):
            return manifest
        if progress:
            print(f"speedgpt: building the local Python-source corpus in {out_dir} ({f'max {max_tokens:,} tokens' if max_tokens else 'all files'})", file=sys.stderr)
        # ensure_val: a small build (`--max-tokens 2000`: 3 files, none below 1 %) still validates on a file
        return tokenize_corpus(
            [source], out_dir, val_fraction=val_fraction, shard_tokens=shard_tokens,
            workers=workers, max_tokens=max_tokens, progress=progress, ensure_val=True,
        )


def _outputs_present(out_dir: Path, manifest: dict) -> bool:
    # A header and size check (not a hash) is enough to notice deleted or truncated shards cheaply.
    from .shards import ShardError, read_header

    for split in ("train", "val"):
        for shard in manifest[split]["shards"]:
            try:
                if read_header(out_dir / shard["file"]) != shard["tokens"]:
                    return False
            except (OSError, ShardError):
                return False
    return True
