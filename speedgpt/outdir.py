"""Output directories of commands (`sweep --out`, `ab --out`, `data ... --out`): made up front, and
file-system errors turned into one line that names the fix, never the raw OS message
("[Errno 20] Not a directory: 'file.bin'"), which says what broke but not what to do."""

from __future__ import annotations

import errno
from pathlib import Path


class OutDirError(ValueError):
    """An output directory cannot be made or written; the message names the fix."""


def _file_on_the_way(path: Path) -> Path | None:
    """`path` itself or the nearest of its parents that exists as something other than a directory."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def os_error_line(e: OSError, flag: str, path: str | Path) -> str:
    """One line for an OSError met while making or writing under `flag` `path`, naming the fix."""
    path = Path(path)
    where = f"{flag} {path}"
    blocker = _file_on_the_way(path)
    if blocker is not None or e.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = blocker or Path(e.filename or path)
        what = "is a file" if blocker == path else f"cannot be made: {blocker} is a file, not a directory"
        return f"{where} {what}; pass a directory (new or existing)"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where}: no permission to write {e.filename or path}; pass a directory you can write to"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{where}: no space left on its device; free some, or pass a directory on another disk"
    if e.errno == errno.ENAMETOOLONG:
        return f"{where}: a name in the path is too long; pass a shorter path"
    detail = e.strerror or type(e).__name__
    return f"{where}: {detail} ({e.filename or path}); check the path, or pass another directory"


def _run_of_checkpoints_folder(path: Path) -> Path | None:
    """The run whose checkpoints folder is `path` or holds it, or None. Training removes that folder's old step
    directories as it keeps the newest (train.keep_checkpoints), and `train --overwrite` the whole folder: an
    output written there (shards, another run) was deleted with them, without a word. A run is told by what only
    training writes (a config.toml alone may be the user's own, beside a `checkpoints/` folder of their outputs)."""
    from .rundir import CHECKPOINTS_DIR, ENV_FILE, METRICS_FILE, RunDir
    from .rundir.checkpoint import list_checkpoints

    path = path.expanduser().resolve()
    for p in (path, *path.parents):
        if p.name == CHECKPOINTS_DIR and RunDir(p.parent).is_run() and (
                (p.parent / ENV_FILE).is_file() or (p.parent / METRICS_FILE).is_file() or list_checkpoints(p)):
            return p.parent
    return None


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """OutDirError with the fix when a file stands where directory `path` (or a parent) must go, or when it lies in
    a run's checkpoints folder; nothing is created (for commands that make the directory only once they have output)."""
    if isinstance(path, str) and not path.strip():  # Path("") is ".": `--out "$OUT"` with $OUT unset wrote the output
        raise OutDirError(f"{flag} is empty; pass a directory (. for this one)")  # into the current directory, exit 0
    path = Path(path)
    if _file_on_the_way(path) is not None:
        raise OutDirError(os_error_line(NotADirectoryError(errno.ENOTDIR, "Not a directory", str(path)), flag, path))
    run = _run_of_checkpoints_folder(path)
    if run is not None and flag == "--resume":  # a checkpoint given for its run
        raise OutDirError(f"--resume {path} lies in the checkpoints folder of run {run}; --resume takes the run "
                          f"directory: --resume {run}")
    if run is not None:
        raise OutDirError(f"{flag} {path} lies in the checkpoints folder of run {run}, whose old checkpoints its "
                          f"training deletes (and `--overwrite` the whole folder); pass a directory outside it")
    return path


def check_new_or_empty_dir(path: str | Path, flag: str, writes: str) -> Path:
    """check_out_dir, and OutDirError when `path` already holds something: for tools whose results would mix with an
    earlier run's there (a rerun of the fault suite resumed its old, finished runs and reported them again).
    `writes`: what the tool puts there, for the message."""
    path = check_out_dir(path, flag)
    if path.is_dir() and any(path.iterdir()):
        raise OutDirError(f"{flag} {path} is not empty; give a new directory ({writes})")
    return path


def make_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create `path` (and its parents) if needed; OutDirError with the fix when it cannot be."""
    path = check_out_dir(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutDirError(os_error_line(e, flag, path)) from None
    return path


def missing_dirs(path: str | Path) -> list[Path]:
    """`path` and those of its parents that do not exist yet, deepest first: what a command will create."""
    path = Path(path)
    return [p for p in (path, *path.parents) if not (p.exists() or p.is_symlink())]


def remove_empty_dirs(dirs: list[Path]) -> None:
    """Remove `dirs` (deepest first) while they are empty directories: a failed command takes back the
    folders it made and left empty, and never touches one that holds anything."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return
