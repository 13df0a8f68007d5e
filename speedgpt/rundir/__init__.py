"""The run directory: its layout, and the one place that reads and writes it.

    RUN_DIR/
      config.toml        the resolved config, run.dir naming this directory (`speedgpt train --config` of it
                         reproduces the run in a new directory)
      plan.json          what the run does, derived from the config (speedgpt/plan.py): steps, batch,
                         stages with their micro-batching, window changes; a record, never read as config
      env.json           code version, packages, hardware, command (rundir/env.py); each resume appended
      .speedgpt-run.lock while a `speedgpt train` runs in it (rundir/lock.py)
      metrics.jsonl      one JSON record per line (rundir/metrics.py)
      checkpoints/       step_NNNNNN/{model.pt, optim.pt, state.json} (rundir/checkpoint.py), or
                         step_NNNNNN/{dcp/, state.json} (rundir/dcp.py: sharded, train.checkpoint_format=dcp)
      tokenizer/         the run's own tokenizer, when its shards were made with one (speedgpt/tokenizer/folder.py;
                         none: GPT-2)
      export/            model.safetensors + config.json + .speedgpt-export.json, the list of the files the
                         export wrote and its source (`speedgpt export`; rundir/export_dir.py)
      report.png, report.html
      compare/           `speedgpt report A B ...`'s files, in the baseline A's directory

A new run never writes into an old run's directory unless told to (rundir/reuse.py).

Training writes it; eval, sampling, export and reports read it through `RunDir`, so none of them
needs the training code. Importing this module is cheap (no torch): reports use it too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import atomic_write

if TYPE_CHECKING:
    from ..config import Config
    from .metrics import MetricsLogger

CONFIG_FILE = "config.toml"
ENV_FILE = "env.json"
PLAN_FILE = "plan.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
EXPORT_DIR = "export"
HF_EXPORT_DIR = "export-hf"  # `speedgpt export --format hf` (transformers' layout)
REPORT_PNG = "report.png"
REPORT_HTML = "report.html"
COMPARE_DIR = "compare"  # `speedgpt report` of several runs, in the first (baseline) run's directory
TOKENIZER_DIR = "tokenizer"  # the run's own tokenizer (speedgpt/tokenizer/folder.py), when it has one
SFT_SPEC_FILE = "sft.json"  # an SFT run's base run, data and options (chat/sft.py)


class RunDir:
    """Paths and readers/writers of one run directory (which need not exist yet)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def env_path(self) -> Path:
        return self.root / ENV_FILE

    @property
    def metrics_path(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def default_export(self) -> Path:
        return self.root / EXPORT_DIR

    @property
    def default_hf_export(self) -> Path:
        return self.root / HF_EXPORT_DIR

    def is_run(self) -> bool:
        """Whether this looks like a directory `speedgpt train` wrote (it holds config.toml)."""
        return self.config_path.is_file()

    # -- config and environment -------------------------------------------------------------
    def write_config(self, cfg: Config) -> None:
        from ..config import to_toml

        atomic_write(self.config_path, to_toml(cfg))

    @property
    def plan_path(self) -> Path:
        return self.root / PLAN_FILE

    def write_plan(self, plan: dict) -> None:
        """The run's plan (plan.RunPlan.as_dict), beside the config it was derived from."""
        atomic_write(self.plan_path, json.dumps(plan, indent=1) + "\n")

    def read_config(self) -> Config:
        """The run's config; a config.toml emptied or cut short is a ConfigError (config/files.py load_run_toml)."""
        from ..config import load_run_toml

        return load_run_toml(self.config_path)

    def write_env(self, snapshot: dict) -> None:
        atomic_write(self.env_path, json.dumps(snapshot, indent=1))

    def read_env(self) -> dict:
        return json.loads(self.env_path.read_text()) if self.env_path.is_file() else {}

    # -- metrics ------------------------------------------------------------------------------
    def metrics_logger(self, **kwargs) -> MetricsLogger:
        from .metrics import MetricsLogger

        return MetricsLogger(self.root, **kwargs)

    def read_metrics(self) -> list[dict]:
        from .metrics import read_metrics

        return read_metrics(self.root)

    # -- checkpoints --------------------------------------------------------------------------
    def list_checkpoints(self) -> list[Path]:
        from .checkpoint import list_checkpoints

        return list_checkpoints(self.checkpoints)

    def latest_checkpoint(self) -> Path:
        from .checkpoint import latest_checkpoint

        return latest_checkpoint(self.checkpoints)

    def save_checkpoint(self, step: int, model_state: dict, optim_state, state: dict, keep: int = 2,
                        keep_every: int = 0) -> Path:
        from .checkpoint import save_checkpoint

        return save_checkpoint(self.checkpoints, step, model_state, optim_state, state, keep=keep,
                               keep_every=keep_every)


def with_run_dir(cfg: Config, run_dir: str | Path) -> Config:
    """`cfg` as the run in `run_dir` saves it: run.dir names the directory the run uses, whichever of --run-dir,
    --resume, run.dir or the default chose it (the saved config said run.dir = '' under --run-dir, and another
    directory under --run-dir A --run.dir=B). Every config.toml is a record of where its run is; `--config
    RUN/config.toml` reproduces the run in a new directory (commands/train.py; --run-dir beats a file's run.dir)."""
    import dataclasses

    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir)))


def default_run_dir(cfg: Config) -> Path:
    """runs/<run.name or preset>-<local time>: where a run goes when neither --run-dir nor run.dir says. A run.name
    with a path in it is a ConfigError (it made nested folders; a resume names its folder and never comes here)."""
    from ..config import ConfigError

    name = cfg.run.name or cfg.preset or "run"
    if any(sep in name for sep in ("/", "\\")) or name in (".", ".."):
        raise ConfigError(f"run.name={name!r} must be a plain name (no path); to choose the folder give --run-dir "
                          f"or --run.dir")
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
