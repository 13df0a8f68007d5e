"""A new run never writes into an old run's directory: refuse it, or clear the old run's files.

Two runs in one directory would mix: the new config over the old, metrics appended to the old
ones, the old checkpoint left where `--resume` and `report` would read it under the new config.

A start that failed before its first step (a bad val shard, a crash while building the model) is
no run: it left only what the start writes, no checkpoint and no metrics record past step 0, so
nothing in it can be resumed or reported. The same command again clears it and starts, saying so,
rather than refusing it as "already holds a run".
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from . import (CHECKPOINTS_DIR, COMPARE_DIR, CONFIG_FILE, ENV_FILE, EXPORT_DIR, HF_EXPORT_DIR, METRICS_FILE,
               PLAN_FILE, REPORT_HTML, REPORT_PNG, SFT_SPEC_FILE, TOKENIZER_DIR)

if TYPE_CHECKING:
    from ..config import Config

# What `speedgpt train` writes into a run directory (and `report` / `export` / TensorBoard after it): --overwrite
# removes every one (an export left behind would be the old model under the new run's name).
RUN_FILES = (CONFIG_FILE, PLAN_FILE, METRICS_FILE, ENV_FILE, CHECKPOINTS_DIR, TOKENIZER_DIR, REPORT_PNG, REPORT_HTML,
             EXPORT_DIR, HF_EXPORT_DIR, "tb", "wandb", COMPARE_DIR, SFT_SPEC_FILE)
_MARKS = (CONFIG_FILE, METRICS_FILE, CHECKPOINTS_DIR)  # any of these: the directory holds a run
# What a start writes before its first step (train/loop.py setup, the metrics loggers): a directory
# with any other of RUN_FILES (a report, an export) holds a run, whatever its metrics say.
_START_FILES = (CONFIG_FILE, PLAN_FILE, METRICS_FILE, ENV_FILE, CHECKPOINTS_DIR, TOKENIZER_DIR, "tb", "wandb",
                SFT_SPEC_FILE)


class RunDirInUse(ValueError):
    pass


def comparable_config(d: dict) -> dict:
    """A config dict without what does not change a run's numbers' identity (its directory, name)."""
    d = json.loads(json.dumps(d))
    d["run"].pop("dir", None)
    d["run"].pop("name", None)
    return d


def found_run_config(run_dir: str | Path) -> Config | None:
    """The config of the run an `ab` or `sweep` finds in its --out, None where the directory holds no run (a runner
    then starts it afresh). A run whose config.toml is unreadable (emptied, cut short, not TOML) or gone is a
    ConfigError naming both ways out: passed over as no run, its finished metrics were counted by `ab` as its plan's
    without a check of its settings."""
    from ..config import ConfigError
    from ..config.files import RESTORE_RUN_CONFIG
    from . import RunDir

    rundir = RunDir(run_dir)
    again = f"or, to train it again, delete {rundir.root} (or use a new --out)"
    if not rundir.is_run():
        if holds_run(rundir.root):  # train writes config.toml first: metrics or checkpoints without it lost it
            raise ConfigError(f"{rundir.root} holds a run's metrics or checkpoints but no {CONFIG_FILE}; "
                              f"{RESTORE_RUN_CONFIG}, {again}")
        return None
    try:
        return rundir.read_config()
    except ConfigError as e:
        raise ConfigError(f"{e}, {again}") from None


def config_differences(run_dir: str | Path, planned: dict) -> list[str] | None:
    """The keys (``section.key``) in which the run that ``run_dir`` holds differs from ``planned`` (a
    `comparable_config`), [] where it is the same, None where the directory holds no run (found_run_config, whose
    ConfigError an unreadable run is). `speedgpt ab` and `sweep` skip or resume a run they find only when it is this
    one."""
    cfg = found_run_config(run_dir)
    return None if cfg is None else differences_from(cfg, planned)


def differences_from(cfg: Config, planned: dict) -> list[str]:
    """config_differences for a run's config already read (sweep reads each run's once)."""
    have = comparable_config(cfg.to_dict())
    if have == planned:
        return []
    keys = [f"{sec}.{k}" for sec, value in planned.items() if isinstance(value, dict)
            for k in value if have.get(sec, {}).get(k) != value[k]]
    return keys or ["preset"]


def holds_run(run_dir: str | Path) -> bool:
    return any((Path(run_dir) / name).exists() for name in _MARKS)


def took_no_step(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds only a failed start: none of RUN_FILES but a start's, an empty (or no)
    checkpoints folder, and metrics (if any) that all parse and have no record past step 0."""
    run_dir = Path(run_dir)
    if any((run_dir / name).exists() for name in RUN_FILES if name not in _START_FILES):
        return False
    ckpts = run_dir / CHECKPOINTS_DIR
    if ckpts.exists() and (not ckpts.is_dir() or any(ckpts.iterdir())):  # even a half-written one: a step
        return False
    metrics = run_dir / METRICS_FILE
    if not metrics.exists():
        return True
    try:
        records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):  # unreadable: not known to be stepless, so kept
        return False
    return all(isinstance(r, dict) and isinstance(r.get("step", 0), (int, float)) and r.get("step", 0) <= 0
               for r in records)


def finished_run(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds a run that logged its final validation (rundir/metrics.py ended_by: all its steps,
    or its time budget); False for anything unreadable."""
    from ..config import ConfigError
    from . import RunDir
    from .metrics import ended_by

    rundir = RunDir(run_dir)
    if not rundir.is_run() or not rundir.metrics_path.is_file():
        return False
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unreadable line is the metrics reader's to report, not this check's
            return ended_by(rundir.read_metrics(), rundir.read_config().train.steps) is not None
    except (ConfigError, OSError, ValueError):
        return False


def prepare_new_run_dir(run_dir: str | Path, *, overwrite: bool, notice: Callable[[str], None] | None = None) -> None:
    """Raise RunDirInUse if ``run_dir`` holds a run; with ``overwrite``, delete that run's files first.
    A failed start (took_no_step) is cleared without ``overwrite``, after a line to ``notice``."""
    run_dir = Path(run_dir)
    if not holds_run(run_dir):
        return
    if not overwrite and took_no_step(run_dir):
        if notice is not None:
            notice(f"notice: {run_dir} holds a start that recorded no training step (no checkpoint, no metrics "
                   f"past step 0); its files are replaced by this run's")
    elif not overwrite:
        # an SFT run (its spec file) continues under `sft`: `train --resume` refuses it (commands/train.py)
        how = "sft --resume" if (run_dir / SFT_SPEC_FILE).is_file() else "train --resume"
        raise RunDirInUse(f"{run_dir} already holds a run; continue it with `speedgpt {how} {run_dir}`, "
                          f"pick a fresh --run-dir, or pass --overwrite to replace it")
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
