"""Which code a result came from: the one place that finds speedgpt's commit, for a run's env.json,
`ab`'s notebook row, `bench` and `sweep`.

The commit is the one of speedgpt's *own* source tree, never of whatever repository happens to
surround it: a copy of the tree without `.git` (an export shipped to a GPU machine, unpacked inside
another checkout) would otherwise be stamped with that other repository's commit. So:

1. git, when the package's own files are tracked by the repository around the package directory
   (`git ls-files --error-unmatch`); then the commit is that repository's HEAD, and `dirty` says
   whether tracked files differ from it;
2. else a `COMMIT` file next to the package (in the tree's root, beside `speedgpt/`), whose first
   line whoever exported the tree wrote (e.g. `git rev-parse HEAD > COMMIT`);
3. else "unknown", and `source` says why.
Importing this module is cheap (no torch); git runs only when asked.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
COMMIT_FILE = "COMMIT"
UNKNOWN = "unknown"


def _git(package_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(package_dir), *args], capture_output=True, text=True, timeout=10)


def _from_git(package_dir: Path) -> dict | None:
    """The commit of the repository that tracks the package's files, or None when none does."""
    try:
        if _git(package_dir, "ls-files", "--error-unmatch", "--", "__init__.py").returncode != 0:
            return None  # no repository here, or one that does not own this copy of the package
        commit = _git(package_dir, "rev-parse", "HEAD").stdout.strip()
        if not commit:
            return None
        dirty = bool(_git(package_dir, "status", "--porcelain", "--untracked-files=no").stdout.strip())
    except Exception:  # no git, a hung one, anything: provenance is best effort, never worth losing a result
        return None
    return {"commit": commit, "dirty": dirty, "source": "git"}


def _from_file(package_dir: Path) -> dict | None:
    path = package_dir.parent / COMMIT_FILE
    try:
        lines = path.read_text(errors="replace").split()
    except OSError:
        return None
    return {"commit": lines[0][:64], "source": f"{path}"} if lines else None


def source_version(package_dir: Path = PACKAGE_DIR) -> dict:
    """{"commit", "source"[, "dirty"]} of speedgpt's source tree (see the module docstring)."""
    package_dir = Path(package_dir)
    return _from_git(package_dir) or _from_file(package_dir) or {
        "commit": UNKNOWN, "source": f"{package_dir} is neither tracked by a git repository nor has a "
                                     f"{COMMIT_FILE} file beside it"}


def short_commit(version: dict | None = None) -> str:
    """The commit for a table row: 10 hex digits, "-dirty" when tracked files were changed, or "unknown"."""
    version = source_version() if version is None else version
    commit = version["commit"]
    if commit == UNKNOWN:
        return UNKNOWN
    return commit[:10] + ("-dirty" if version.get("dirty") else "")
