"""Document sources for tokenization: text files, JSONL, Parquet, the local Python sources.

Every source yields ``(doc_id, text)`` pairs in a fixed order (sorted file names, file
order within a file), so tokenizing the same inputs twice gives the same shards.
Items that cannot be read are not dropped silently: each source counts them by reason in
``source.skipped`` (with a few examples), and the tokenizer copies that into its manifest.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import random
import sys
import sysconfig
import zlib
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

_MAX_EXAMPLES = 5  # per skip reason: enough to find the problem, small enough for a manifest
MISSING_FIELD = "no string field"  # the skip reason of a JSONL record without the text field


class Skipped:
    """Counts of skipped items by reason, with the first few examples of each."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, item: str, reason: str) -> None:
        self.counts[reason] += 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < _MAX_EXAMPLES:
            examples.append(item)

    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict:
        return {reason: {"count": n, "examples": self.examples[reason]} for reason, n in sorted(self.counts.items())}


def doc_hash(text: str) -> int:
    """A document's 64-bit identity: what deduplication compares and what decides its train/val split."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class Source:
    """A deterministic stream of text documents. Subclasses implement ``_iter``."""

    kind = "source"

    def __init__(self) -> None:
        self.skipped = Skipped()

    def describe(self) -> dict:
        """JSON-able identity of the source (what a manifest records and compares)."""
        raise NotImplementedError

    def split_key(self, doc_id: str) -> int | None:
        """The hash that decides document `doc_id`'s train/val split: None for its own text's (doc_hash). A
        source whose documents are pieces of larger units returns the unit's, so no unit straddles the split."""
        return None

    def documents(self) -> Iterator[tuple[str, str]]:
        """Yield (doc_id, text); resets the skip counts, so a second pass counts afresh."""
        self.skipped = Skipped()
        for doc_id, text in self._iter():
            if not text:
                self.skipped.add(doc_id, "empty document")
                continue
            yield doc_id, text

    def _iter(self) -> Iterator[tuple[str, str]]:
        raise NotImplementedError


class Documents(Source):
    """Documents already in memory: a list of texts or of (doc_id, text) pairs."""

    kind = "documents"

    def __init__(self, docs, *, name: str = "in-memory"):
        super().__init__()
        self.docs = [(str(i), d) if isinstance(d, str) else (str(d[0]), d[1]) for i, d in enumerate(docs)]
        self.name = name

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "documents": len(self.docs)}

    def _iter(self):
        yield from self.docs


def expand_paths(patterns: str | os.PathLike | list, suffixes: tuple[str, ...] | None = None) -> list[Path]:
    """Files named by paths, directories (searched recursively) and globs, sorted and deduplicated.

    Raises FileNotFoundError naming the pattern that matched nothing.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    found: set[Path] = set()
    for pattern in patterns:
        pattern = str(pattern)
        if os.path.isdir(pattern):
            hits = [p for p in Path(pattern).rglob("*") if p.is_file()]
        else:
            hits = [Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        if suffixes is not None:
            hits = [p for p in hits if p.name.endswith(suffixes)]
        if not hits:
            kind = f" with suffix {'/'.join(suffixes)}" if suffixes else ""
            raise FileNotFoundError(f"no files{kind} found for {pattern!r}; check the path or glob")
        found.update(hits)
    return sorted(found)


class TextFiles(Source):
    """One file = one document (UTF-8). Undecodable or unreadable files are skipped and counted."""

    kind = "text"

    def __init__(self, paths, *, suffixes: tuple[str, ...] | None = None):
        super().__init__()
        self.patterns = [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self.files = expand_paths(self.patterns, suffixes)
        self.suffixes = suffixes

    def describe(self) -> dict:
        return {"kind": self.kind, "paths": self.patterns, "suffixes": list(self.suffixes or []), "files": len(self.files)}

    def _iter(self):
        for path in self.files:
            text = _read_text(path, self.skipped)
            if text is not None:
                yield str(path), text


def _read_text(path: Path, skipped: Skipped, item: str | None = None) -> str | None:
    item = str(path) if item is None else item
    try:
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # git's test for binary: text never holds NUL bytes
            skipped.add(item, "binary (NUL bytes)")
            return None
        return data.decode("utf-8")
    except UnicodeDecodeError:
        skipped.add(item, "not UTF-8")
    except OSError as e:
        skipped.add(item, f"unreadable ({type(e).__name__})")
    return None


class JsonlFiles(Source):
    """One JSON object per line; the document is ``obj[text_field]``. ``.jsonl.gz`` works too."""

    kind = "jsonl"

    def __init__(self, paths, *, text_field: str = "text"):
        super().__init__()
        self.patterns = [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self.files = expand_paths(self.patterns)
        self.text_field = text_field

    def describe(self) -> dict:
        return {"kind": self.kind, "paths": self.patterns, "text_field": self.text_field, "files": len(self.files)}

    def _iter(self):
        for path in self.files:
            if path.suffix == ".json" and _starts_with(path, b"["):  # a JSON array of records, not JSON lines
                yield from self._array(path)
                continue
            opener = gzip.open if path.name.endswith(".gz") else open
            lineno = 0
            try:
                # Bytes, decoded line by line: one line that is not UTF-8 is skipped alone (decoding the whole
                # file as text dropped every line after it)
                with opener(path, "rb") as f:
                    for lineno, raw in enumerate(f, 1):
                        item = f"{path}:{lineno}"
                        try:
                            line = raw.decode("utf-8")
                        except UnicodeDecodeError:
                            self.skipped.add(item, "not UTF-8")
                            continue
                        if not line.strip():
                            continue
                        try:
                            obj = json.loads(line)
                        except json.JSONDecodeError:
                            self.skipped.add(item, "invalid JSON")
                            continue
                        text = self._text(obj, item)
                        if text is not None:
                            yield item, text
            except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz ends the file there
                after = f" (read up to line {lineno}: {e})" if lineno else f" ({e})"
                self.skipped.add(f"{path}{after}", f"unreadable ({type(e).__name__})")

    def _array(self, path: Path):
        """The records of a .json file holding one array (pretty-printed or not): each read as a JSON line is."""
        try:
            records = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            self.skipped.add(f"{path} ({e})", "unreadable JSON array")
            return
        for i, obj in enumerate(records if isinstance(records, list) else [records]):
            item = f"{path}[{i}]"
            text = self._text(obj, item)
            if text is not None:
                yield item, text

    def _text(self, obj, item: str) -> str | None:
        """The record's text field, or None after counting the record as skipped."""
        text = obj.get(self.text_field) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            # The fields it has: the likely value for --text-field is among them.
            fields = f" with fields: {', '.join(map(str, list(obj)[:8]))}" if isinstance(obj, dict) else ""
            self.skipped.add(item + fields, f"{MISSING_FIELD} {self.text_field!r}")
            return None
        return text


def _starts_with(path: Path, prefix: bytes) -> bool:
    """Whether the file's first non-blank bytes are `prefix` (False when it cannot be read: the reader says why)."""
    try:
        with open(path, "rb") as f:
            return f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf").startswith(prefix)
    except OSError:
        return False


class ParquetFiles(Source):
    """The ``text_column`` of Parquet files, read in row-group-sized batches with pyarrow."""

    kind = "parquet"

    def __init__(self, paths, *, text_column: str = "text", batch_rows: int = 1024):
        super().__init__()
        self.patterns = [str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
        self.files = expand_paths(self.patterns, (".parquet",))
        self.text_column = text_column
        self.batch_rows = batch_rows

    def describe(self) -> dict:
        return {"kind": self.kind, "paths": self.patterns, "text_column": self.text_column, "files": len(self.files)}

    def _iter(self):
        import pyarrow.parquet as pq  # imported on use: pyarrow is heavy

        for path in self.files:
            try:
                pf = pq.ParquetFile(path)
            except Exception as e:  # pyarrow raises its own error types for corrupt files
                self.skipped.add(str(path), f"unreadable parquet ({type(e).__name__})")
                continue
            if self.text_column not in pf.schema_arrow.names:
                raise ValueError(
                    f"{path} has no column {self.text_column!r} (columns: {', '.join(pf.schema_arrow.names)}); "
                    "name the text's column with --text-field (text_column=)"
                )
            row = 0
            # One row group at a time keeps memory bounded by the file's row-group size.
            for group in range(pf.num_row_groups):
                for batch in pf.iter_batches(batch_size=self.batch_rows, row_groups=[group], columns=[self.text_column]):
                    for text in batch.column(0).to_pylist():
                        item = f"{path}:{row}"
                        row += 1
                        if text is None:
                            self.skipped.add(item, "null text")
                            continue
                        if not isinstance(text, str):
                            self.skipped.add(item, "text is not a string")
                            continue
                        yield item, text


class PythonSourceFiles(Source):
    """The ``.py`` files of the running interpreter's stdlib and site-packages.

    A corpus that exists on every machine that can run speedgpt: the default training data
    when nothing else is there. Files are ordered by root (stdlib first), then by a stable
    hash of the relative path; doc ids are
    ``<root label>/<relative path>`` so the val split does not depend on the install prefix.

    ``piece_chars=0``: one document per file. ``piece_chars=N``: each file is cut into pieces of
    about N characters at top-level statements (python_pieces) and the pieces are shuffled
    (buffered_shuffle, seeded: the same corpus on every build), so a small training step holds
    pieces of many files instead of a slice of one (a step of 1,024 tokens is a ninth of an average
    file); every piece of a file takes the file's train/val split (split_key), so validation
    scores files the model never saw a piece of. Doc ids of pieces are ``<file doc id>#<k>``.
    """

    kind = "python-source"

    def __init__(self, piece_chars: int = 0) -> None:
        super().__init__()
        if piece_chars < 0:
            raise ValueError(f"piece_chars={piece_chars} must be >= 0 (0: whole files)")
        self.piece_chars = piece_chars
        # file doc id -> doc_hash of its whole text (piece mode): a file's pieces land where the file itself
        # lands in a build of whole files, so the two corpora of one machine share their val files
        self._file_keys: dict[str, int] = {}
        self.roots = python_source_roots()
        self.files: list[tuple[str, Path]] = []
        seen: set[Path] = set()
        for label, root in self.roots:
            for dirpath, dirnames, filenames in os.walk(root):
                # The stdlib tree may hold the base interpreter's own site-packages, which is
                # not this environment's: only the roots from sysconfig count.
                skip = {"__pycache__"} | ({"site-packages", "dist-packages"} if dirpath == str(root) else set())
                dirnames[:] = sorted(d for d in dirnames if d not in skip)
                for name in sorted(filenames):
                    if name.endswith(".py"):
                        path = Path(dirpath, name)
                        key = path.resolve()
                        if key not in seen:  # site-packages may sit inside the stdlib tree
                            seen.add(key)
                            self.files.append((f"{label}/{path.relative_to(root).as_posix()}", path))
        # Roots in order (stdlib first: the same on every machine with this Python), then a stable
        # hash of the path: alphabetical order would put whole packages back to back, so a capped
        # corpus (and the first steps of any run) would see a few packages instead of a sample.
        order = {label: i for i, (label, _) in enumerate(self.roots)}
        self.files.sort(key=lambda item: (order[item[0].split("/", 1)[0]], _path_hash(item[0])))

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "roots": [label for label, _ in self.roots],
            "files": len(self.files),
            "order": "path-hash",
            **({"documents": f"pieces of ~{self.piece_chars} chars, split by file, shuffled (buffer "
                             f"{SHUFFLE_BUFFER}, seed {SHUFFLE_SEED})"} if self.piece_chars else {}),
        }

    def split_key(self, doc_id: str) -> int | None:
        return self._file_keys.get(doc_id.rsplit("#", 1)[0]) if self.piece_chars else None

    def _iter(self):
        if not self.piece_chars:
            yield from self._files()
            return
        yield from buffered_shuffle(self._pieces(), SHUFFLE_BUFFER, SHUFFLE_SEED)

    def _files(self):
        for doc_id, path in self.files:
            text = _read_text(path, self.skipped, doc_id)
            if text is not None:
                yield doc_id, text

    def _pieces(self):
        for doc_id, text in self._files():
            # A file's text hash keys its split: identical files (vendored copies) land together.
            self._file_keys[doc_id] = doc_hash(text)
            if not text:
                yield doc_id, text  # counted as an empty document
            for k, piece in enumerate(python_pieces(text, self.piece_chars)):
                yield f"{doc_id}#{k}", piece


# Piece mode's shuffle: a window of this many pieces (about 16 MB of text at 1,000 chars; the tiny-cpu
# preset's whole 5M-token corpus) mixes the pieces of several hundred files, so that also the first
# tokens of the val split, which validation scores, come from many of its files (with 1,024 pieces the
# first 16K val tokens were a handful of files, 0.2 above the whole split's loss); the seed makes every
# build of the corpus the same.
SHUFFLE_BUFFER = 8192
SHUFFLE_SEED = 0


def buffered_shuffle(items: Iterable, size: int, seed: int) -> Iterator:
    """`items` in a random order that needs only `size` of them in memory: each new item takes the
    place of a random one in the buffer, which is emitted (the rest, shuffled, at the end). Items
    move at most a few buffer lengths from their place; deterministic for a given seed."""
    rng = random.Random(seed)
    buffer: list = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = rng.randrange(size)
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer


def python_pieces(text: str, piece_chars: int) -> Iterator[str]:
    """Python source cut into consecutive pieces of about `piece_chars` characters; joined, they give
    the text back. Once a piece holds `piece_chars`, it ends before the next statement at the top
    level or one indent in (a def, class, method, import, comment: a line at column 0, or indented at
    most 4 columns after a blank line; not a closing bracket, nor the line after a decorator); at
    twice that before any line after a blank line, at four times before any line."""
    piece: list[str] = []
    size = 0
    previous = ""  # the last non-blank line
    after_blank = False
    for line in text.splitlines(keepends=True):
        body = line.lstrip(" \t")
        indent = len(line) - len(body)
        opens = body[:1] not in ("", "\n", "\r", ")", "]", "}") and not previous.lstrip().startswith("@")
        statement = opens and (indent == 0 or (indent <= 4 and after_blank))
        if piece and ((size >= piece_chars and statement) or (size >= 2 * piece_chars and after_blank)
                      or size >= 4 * piece_chars):
            yield "".join(piece)
            piece, size = [], 0
        piece.append(line)
        size += len(line)
        after_blank = not body.strip()
        if not after_blank:
            previous = line
    if piece:
        yield "".join(piece)


def python_source_roots() -> list[tuple[str, Path]]:
    """[(label, directory)] of the stdlib and site-packages directories that exist, without duplicates."""
    paths = sysconfig.get_paths()
    roots: list[tuple[str, Path]] = []
    for label, key in (("stdlib", "stdlib"), ("site-packages", "purelib"), ("site-packages-plat", "platlib")):
        p = Path(paths[key])
        if p.is_dir() and all(p.resolve() != r.resolve() for _, r in roots):
            roots.append((label, p))
    return roots


def _path_hash(doc_id: str) -> bytes:
    return hashlib.blake2b(doc_id.encode(), digest_size=8).digest()


def python_source_files(piece_chars: int = 0) -> PythonSourceFiles:
    """The local Python-source corpus (stdlib + site-packages ``.py`` files), as a Source: one document
    per file, or shuffled pieces of about `piece_chars` characters (PythonSourceFiles)."""
    return PythonSourceFiles(piece_chars)
