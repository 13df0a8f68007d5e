"""A new run never writes into an old run's directory: refuse it, or clear the old run's files.

Two runs in one directory would mix: the new config over the old, metrics appended to the old
ones, the old checkpoint left where `--resume` and `report` would read it under the new config.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from . import (CHECKPOINTS_DIR, COMPARE_DIR, CONFIG_FILE, ENV_FILE, EXPORT_DIR, METRICS_FILE, PLAN_FILE,
               REPORT_HTML, REPORT_PNG)

# What `speedgpt train` writes into a run directory (and `report` / `export` / TensorBoard after it).
RUN_FILES = (CONFIG_FILE, PLAN_FILE, METRICS_FILE, ENV_FILE, CHECKPOINTS_DIR, REPORT_PNG, REPORT_HTML, EXPORT_DIR,
             "tb", "wandb", COMPARE_DIR)
_MARKS = (CONFIG_FILE, METRICS_FILE, CHECKPOINTS_DIR)  # any of these: the directory holds a run


class RunDirInUse(ValueError):
    pass


def holds_run(run_dir: str | Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in _MARKS)


def prepare_new_run_dir(run_dir: str | Path, *, overwrite: bool) -> None:
    """Raise RunDirInUse if ``run_dir`` holds a run; with ``overwrite``, delete that run's files first."""
    run_dir = Path(run_dir)
    if not holds_run(run_dir):
        return
    if not overwrite:
        raise RunDirInUse(f"{run_dir} already holds a run; continue it with `speedgpt train --resume {run_dir}`, "
                          f"pick a fresh --run-dir, or pass --overwrite to replace it")
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
