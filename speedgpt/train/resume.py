"""What a resume checks against the checkpoint it continues, so it never trains something other than
the run it names, nor silently redoes a finished one:

- a run already at its end (its last step, or its time budget spent) is complete: nothing to train,
  the command says so and exits 0 (no new sample, no rewritten report);
- a config whose schedule differs from the checkpoint's (another train.steps stretches every lr,
  momentum and window schedule over the new length from the checkpoint on; another optimizer value
  changes it too) is refused unless the command says --extend;
- the weights must fit the model the config describes (else one line naming the config keys that
  changed since the checkpoint was written).

Each checkpoint's state.json carries the resolved config of the run that wrote it ("config"), the
reference for these checks; checkpoints written before it did fall back to the run's config.toml
and the weights' shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config, ConfigError, config_from_dict, flat_config
from ..rundir import RunDir
from ..rundir.checkpoint import CheckpointError, read_state

# The keys the schedules are functions of (step / train.steps, the stage table, schedule.*), and the optimizer's
# values they scale: a resume with another lr or momentum changes the run from that step on, and its config.toml
# would then say the new value for the steps before too (a new-user audit: accepted without a word).
SCHEDULE_KEYS = ("train.steps", "train.stages", "schedule.", "optim.")


class RunComplete(Exception):
    """A resume of a run that has reached its end: there is nothing to train."""


def config_changes(saved: dict | None, cfg: Config, prefix: str | tuple[str, ...] = "") -> list[str]:
    """"model.depth: checkpoint 4, config 6" for each key under `prefix` whose value in `cfg` differs
    from the checkpoint's saved config (`saved`, a Config.to_dict(); none when it is unknown)."""
    if not saved:
        return []
    return _changes(flat_config(saved), flat_config(cfg.to_dict()), prefix)


def schedule_changes(saved: dict | None, cfg: Config) -> list[str]:
    """config_changes under SCHEDULE_KEYS, a stage's row length left out: the planner fits rows to the world size
    (stages.fit_rows_to_world), so a run resumed on another number of ranks may plan other rows on the same
    schedule (its start log says which)."""
    if not saved:
        return []
    before, now = flat_config(saved), flat_config(cfg.to_dict())
    for flat in (before, now):
        if flat.get("train.stages"):
            flat["train.stages"] = [{k: v for k, v in row.items() if k != "seq_len"} for row in flat["train.stages"]]
    return _changes(before, now, SCHEDULE_KEYS)


def _changes(before: dict, now: dict, prefix: str | tuple[str, ...]) -> list[str]:
    keys = [k for k in now if k.startswith(prefix) and k in before and before[k] != now[k]]
    return [f"{k}: checkpoint {_show(before[k])}, config {_show(now[k])}" for k in keys]


def check_resume(cfg: Config, run_dir: Path, *, extend: bool = False) -> None:
    """Before a resume of `run_dir` with the resolved `cfg`: ConfigError when the schedule would change
    without `extend`, RunComplete when the latest checkpoint is already the run's end. Nothing is
    checked without a checkpoint (loading it says what is wrong)."""
    found = RunDir(run_dir).list_checkpoints()
    if not found:
        return
    state = read_state(found[-1])
    step, saved = int(state.get("step", 0)), _saved_config(run_dir, state)
    changes = schedule_changes(saved, cfg)
    if changes and not extend:
        raise ConfigError(f"resuming {run_dir} at step {step} with {'; '.join(changes)} would change its "
                          f"schedules from that step on{_lr_change(saved, cfg, step)}; add --extend to do so, "
                          f"or resume with the run's own values")
    budget = cfg.train.time_budget_s
    if step >= cfg.train.steps or (budget and float(state.get("train_time_s", 0.0)) >= budget):
        end = f"step {step} of {cfg.train.steps}" if step >= cfg.train.steps else f"time budget of {budget}s spent"
        raise RunComplete(f"{run_dir} is complete ({end}); nothing to train. To train it further: "
                          f"speedgpt train --resume {run_dir} --train.steps=N --extend")


def _saved_config(run_dir: Path, state: dict) -> dict | None:
    if state.get("config"):
        return state["config"]
    try:  # a checkpoint from before state.json kept the config: the run's file is the best record
        return RunDir(run_dir).read_config().to_dict()
    except (OSError, ValueError):
        return None


def _lr_change(saved: dict | None, cfg: Config, step: int) -> str:
    """", which moves muon lr at step 100 from 0.006 to 0.014" (empty when it does not move)."""
    from ..plan import RunPlan

    try:
        before_cfg = config_from_dict(saved)
        before = before_cfg.optim.muon_lr * RunPlan.of(before_cfg).lr_mult_at(step)
    except (ValueError, TypeError):
        return ""
    after = cfg.optim.muon_lr * RunPlan.of(cfg).lr_mult_at(step)
    return "" if before == after else f", which moves muon lr at step {step} from {before:.3g} to {after:.3g}"


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def model_mismatch(path: Path, state: dict, cfg: Config, problem: str) -> CheckpointError:
    """The error for a checkpoint whose weights do not fit the model (`problem`, rundir/weights.py's
    weights_mismatch), naming the model keys that changed since it was written where it knows them."""
    changes = config_changes(state.get("config"), cfg, "model.")
    detail = "; ".join(changes) if changes else problem
    return CheckpointError(f"checkpoint {path} does not fit the model this config describes ({detail}); resume "
                           f"with the model settings the run was trained with, or start a new run in another --run-dir")
