"""One `speedgpt train` at a time per run directory: a lock file held for the command's whole life.

    RUN_DIR/.speedgpt-run.lock   {"pid": 4242, "host": "gpu-7", "started": "2026-11-26 10:02:11", "command": "..."}

`speedgpt train` (rank 0 under torchrun) takes it before it looks at what the directory holds, so two
commands started at the same moment cannot both pass the "already holds a run" check and then write
one directory together (metrics twice over, one run's config beside the other's checkpoints).

The lock is `fcntl.flock` on the file, kept open until the command ends: the kernel drops it when the
process ends however it ends (kill -9 included), so a dead run's lock is never taken for a live one.
The JSON record is only for the messages: who holds the lock, or whose lock was left behind. On a
clean end the file is removed (and the directories taking it made, if the run wrote nothing into
them, e.g. when it was refused for its data). Taking the lock is also the first write into the directory, so a path
that cannot be written is an error before any data is prepared.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..outdir import OutDirError, check_out_dir, missing_dirs, os_error_line, remove_empty_dirs

LOCK_FILE = ".speedgpt-run.lock"


class RunLocked(ValueError):
    """Another live process holds the run directory; the message names it and what to do."""


class RunLock:
    """A held run-directory lock; `release()` (or leaving a `with` block) gives it back."""

    def __init__(self, run_dir: Path, fd: int | None, created: list[Path]):
        self.run_dir, self.path = run_dir, run_dir / LOCK_FILE
        self.fd, self.created = fd, created  # the directories taking the lock made (deepest first)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _is_open_file(self.fd, self.path):  # remove it while holding it: see lock_run_dir's loop
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        remove_empty_dirs(self.created)  # only while empty: a run that wrote files keeps them


def lock_run_dir(run_dir: str | os.PathLike, *, flag: str = "--run-dir",
                 notice: Callable[[str], None] | None = None) -> RunLock:
    """Make `run_dir` if needed and lock it for this process. RunLocked when a live process holds it;
    OutDirError (one line naming `flag` and the fix) when it cannot be made or written. `notice` gets
    one line when a lock left by a run that died is taken over, or when the file system has no locks."""
    run_dir = Path(run_dir)
    notice = notice or (lambda line: print(line, file=sys.stderr, flush=True))
    check_out_dir(run_dir, flag)  # (not in another run's checkpoints folder)
    try:
        created = missing_dirs(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                locked = _try_flock(fd)
            except BlockingIOError:
                holder = _await_record(fd)
                os.close(fd)
                raise RunLocked(_held_message(run_dir, flag, holder)) from None
            except OSError:
                os.close(fd)
                raise
            if locked is None:
                notice(f"notice: {run_dir} is on a file system without file locks: a second `speedgpt train` "
                       f"on it at the same time would not be stopped")
                break
            if _is_open_file(fd, path):
                previous = _read_record(fd)  # a clean end removes the file: a record here is a dead run's
                if previous is not None:
                    notice(f"notice: {run_dir} was locked by {_describe(previous)}, which ended without "
                           f"releasing it; taking the lock over")
                break
            os.close(fd)  # the holder released (removed) the file between our open and our lock: again
        _write_record(fd)
    except OSError as e:
        raise OutDirError(os_error_line(e, flag, run_dir)) from None
    return RunLock(run_dir, fd, created)


def _try_flock(fd: int) -> bool | None:
    """True once locked; None where locks are unavailable (no fcntl, or a file system without flock).
    BlockingIOError when another process holds it."""
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise
    except OSError as e:
        import errno

        if e.errno in (errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise
    return True


def _is_open_file(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (not removed, nor replaced by another)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read_record(fd: int) -> dict | None:
    """The holder's record; None for an empty file, {} for one that cannot be read."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, 1 << 16)
    if not data.strip():
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


# How long a refused command waits for the holder's record: the holder writes it just after taking the lock, and a
# reader in between found the file empty and named a live run "a process that left no record" (a flake of
# tests/test_run_lock.py on a busy 2-core machine).
RECORD_WAIT_S = 2.0


def _await_record(fd: int) -> dict | None:
    """_read_record, waiting up to RECORD_WAIT_S for a holder that has not written its record yet."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while (record := _read_record(fd)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return record


def _write_record(fd: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(["speedgpt", *sys.argv[1:]])}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(record) + "\n").encode())
    os.fsync(fd)


def _describe(record: dict) -> str:
    if not record:
        return "a process that left no record"
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')} (started {record.get('started', '?')})"


def _held_message(run_dir: Path, flag: str, holder: dict | None) -> str:
    who = _describe(holder or {})
    pid = (holder or {}).get("pid")
    stop = f"stop it (kill {pid})" if pid else "stop it"
    if flag == "--resume":
        return (f"--resume {run_dir}: the run is in progress, trained by {who}; wait for it to finish, or "
                f"{stop} and resume then")
    return (f"{flag} {run_dir} is in use by a training run in progress ({who}); wait for it to finish, "
            f"{stop}, or pick another {flag}")
