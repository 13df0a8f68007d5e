"""Reading runs for reports: the run directory contract only (config.toml, metrics.jsonl), so a
report works on finished, crashed and still-running runs alike, and on older runs."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..rundir import RunDir
from ..rundir.metrics import SFT_EVAL_EVENT, finite, read_metrics

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport (a declared dependency there)
    import tomli as tomllib


@dataclass
class RunData:
    dir: Path
    label: str
    config: dict = field(default_factory=dict)
    config_text: str = ""
    config_unreadable: bool = False  # a config.toml is there, but not TOML or cut short: its values are unknown
    records: list[dict] = field(default_factory=list)

    @property
    def train(self) -> list[dict]:
        return [r for r in self.records if finite(r.get("train_loss"))]

    @property
    def evals(self) -> list[dict]:
        return [r for r in self.records if finite(r.get("val_loss"))]

    @property
    def sft_evals(self) -> list[dict]:
        """An SFT run's held-out evaluations (chat/sft.py): its assistant-token loss and ChatCORE, not a val loss."""
        return [r for r in self.records if r.get("event") == SFT_EVAL_EVENT and finite(r.get("heldout_loss"))]


def load_run(run_dir: str | os.PathLike) -> RunData:
    """Read one run dir; a missing metrics.jsonl is an error, a missing/bad config.toml is not: a warning, the
    label then falls back to the directory name and the run's config is unknown. One cut short (a section lost)
    counts as bad: read as it stands, the defaults filled in what it lost and the A/B table's overrides showed them
    as the run's settings (`data.seq_len=1024` beside a 128-token run)."""
    from ..config.files import run_config_cut_short

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    config, text, unreadable = {}, "", False
    cfg_path = RunDir(run_dir).config_path
    if cfg_path.is_file():
        text = cfg_path.read_text(encoding="utf-8")
        try:
            config = tomllib.loads(text)
            cut = run_config_cut_short(cfg_path, config)
        except tomllib.TOMLDecodeError as e:
            cut = f"{cfg_path}: unreadable TOML ({e})"
        if cut:
            warnings.warn(f"{cut}; labelling the run by its directory name, its settings unknown")
            config, unreadable = {}, True
    name = (config.get("run") or {}).get("name")
    label = str(name) if name else (run_dir.resolve().name or str(run_dir))
    return RunData(dir=run_dir, label=label, config=config, config_text=text, config_unreadable=unreadable,
                   records=records)


def load_runs(run_dirs: Sequence[str | os.PathLike]) -> list[RunData]:
    if not run_dirs:
        raise ValueError("no run directories given: pass at least one RUN_DIR")
    runs = [load_run(d) for d in run_dirs]
    if not any(run.records for run in runs):  # a page of "–" cells and empty panels would say nothing
        why = "logged no step yet, or every line is unreadable"
        if len(runs) == 1:
            raise ValueError(f"{runs[0].dir}: its metrics.jsonl holds no readable record (the run {why}); report it "
                             f"once it has trained a step")
        raise ValueError(f"none of {', '.join(str(run.dir) for run in runs)} holds a readable record in its "
                         f"metrics.jsonl (each {why}); report them once one has trained a step")
    # Two runs with the same name (e.g. the same preset twice) need distinct legend entries.
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    for run in runs:
        if seen[run.label] > 1:
            run.label = f"{run.label} ({run.dir})"
    return runs
