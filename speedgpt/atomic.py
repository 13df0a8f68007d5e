"""Atomic file writes: a reader (or a process restarted after a crash) sees the old file or the
new one, never a half-written one.

The recipe: write a temporary file next to the target, fsync it, rename it over the target, then
fsync the directory so the rename itself survives a power loss. `publish_dir` does the last two
steps for a whole directory written under a temporary name (a checkpoint).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import BinaryIO, Callable


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make renames inside `directory` durable (best effort: not every OS can fsync a directory)."""
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


def atomic_write(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], None]) -> Path:
    """Write `data` (bytes, or a function that writes to a binary file) to `path` atomically.

    On any error the temporary file is removed and the old `path`, if any, is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    # os.open with 0o666 honours the umask (tempfile.mkstemp would create 0600 files).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def publish_dir(tmp: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Rename a fully written (and fsynced) directory `tmp` to `final`, durably.

    `final` must not exist: renaming over a directory is not atomic, so a caller replacing one
    removes it first (and accepts that a crash in between leaves neither)."""
    tmp, final = Path(tmp), Path(final)
    fsync_dir(tmp)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    return final
