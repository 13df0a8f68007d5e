"""Atomic writes: the one way speedgpt puts a file or a directory under its final name.

Everything is written under a temporary name in the target's own directory (so the final rename
stays on one filesystem), flushed and fsynced, then renamed over the target, and the directory
is fsynced so the rename itself survives a power cut. A crash therefore leaves the old file (or
none), never a half-written one under the final name; temporary names start with "." so readers
that list a directory skip them. New files get mode 0666 minus the umask, like any other file
the user creates (tempfile's 0600 would make shared shards and exports private).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 4 MiB blocks (shard manifests and checkpoint checksums)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in `directory` durable; best effort where the OS cannot (e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def temp_name(path: Path) -> Path:
    """A hidden, unique sibling of `path` for writing it."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator:
    """Open a temporary sibling of `path` for writing; on a clean exit it is fsynced and renamed
    over `path`, on an exception removed. `mode` is "wb" or "w" (text, UTF-8)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[BinaryIO], None]) -> Path:
    """Write `data` (bytes, text as UTF-8, or a function that writes to a binary file) to `path`
    atomically; on any error the old `path`, if any, is untouched."""
    with atomic_file(path, "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def publish_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Rename a fully written directory `tmp` (its files fsynced) to `final`, durably. `final` must
    not exist: renaming over a directory is not atomic, so a caller replacing one moves it aside
    first (and accepts that a crash in between leaves neither under the final name)."""
    tmp, final = Path(tmp), Path(final)
    fsync_dir(tmp)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    return final


@contextlib.contextmanager
def staging_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new, empty, hidden sibling directory of `path` (same filesystem, so its files can be
    renamed into place) with the umask's mode; it is removed on exit, with whatever is still in it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def seal_files(directory: str | os.PathLike) -> list[Path]:
    """Give every file under `directory` the umask's mode and fsync it (before renaming it into place);
    returns the files, sorted. Some writers (safetensors) create private files: an export is meant to be shared."""
    mode = 0o666 & ~_umask()
    files = sorted(f for f in Path(directory).rglob("*") if f.is_file())
    for f in files:
        os.chmod(f, mode)
        fsync_file(f)
    return files


def _umask() -> int:
    umask = os.umask(0)  # the only way to read it is to set it
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary sibling directory of `path` to fill; on a clean exit every file in
    it gets the umask's mode and is fsynced, and the directory replaces `path` (an existing one is removed first: between the
    two, `path` is briefly absent, never half-written). On an exception the temporary is removed."""
    path = Path(path)
    with staging_dir(path) as tmp:
        yield tmp
        seal_files(tmp)
        if path.exists():
            shutil.rmtree(path)
        publish_dir(tmp, path)
