"""What a resume checks against the checkpoint it continues, so it never trains something other than
the run it names, nor silently redoes a finished one:

- a run already at its end (its last step, or its time budget spent) is complete: nothing to train,
  the command says so and exits 0 (no new sample, no rewritten report); one stopped in its last step, or in
  the step that spent its time budget (a signal saves that step's checkpoint before its final validation), is
  resumed to validate it, which is all it lacks;
- a config whose schedule differs from the checkpoint's (another train.steps stretches every lr,
  momentum and window schedule over the new length from the checkpoint on; another optimizer value
  changes it too) is refused unless the command says --extend;
- a value the loader's saved position holds for (the seed, how rows are packed and mixed: LOADER_KEYS) is
  refused, --extend or not;
- any other value that shapes the training from the checkpoint on (how the data is cut, the batch, the
  model's values that leave its weights' shapes alone) is refused too unless the command says --extend: config.toml would otherwise say it held from step 0. Only RESUMABLE_KEYS (paths, cadences,
  checkpointing, compile and kernel settings, the hardware) change freely; an accepted change is named in
  env.json's entry for the resume;
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
# What the loader's saved position is only valid for (data/loader.py load_state_dict refuses another value): refused
# before anything is built, --extend or not (with --extend the loader refused it after the model was built).
LOADER_KEYS = ("train.seed", "data.packing", "data.long_docs", "data.continued_bos", "data.shuffle_first_epoch",
               "data.mix_docs")
# What a resume may change without --extend: where things are (paths), how often the run logs, validates and
# checkpoints, how it compiles and which kernels compute the same math, and the hardware it runs on. The training
# data itself is checked by the loader's state (the same shard names and token count). Everything else changes the
# training from the resumed step on (a new-user audit: a resume took another batch, seed or softcap without a word).
RESUMABLE_KEYS = (
    "run.", "parallel.", "data.train_files", "data.val_files", "data.cache_dir", "data.tokenizer",
    "data.on_bad_shard", "train.val_every", "train.log_every", "train.checkpoint_", "train.save_final_checkpoint",
    "train.keep_checkpoint", "train.on_nonfinite", "train.rollback_lr_factor", "train.max_rollbacks",
    "train.device", "train.dtype", "train.compile", "train.coordinate_descent_tuning", "train.autotune_pointwise",
    "train.persistent_reductions_upto", "train.warmup_steps", "train.time_budget_s", "train.peak_flops",
    "train.micro_batch_size", "model.attn_backend", "model.fused_ce", "model.fused_mtp", "model.fp8_mlp_fused_act",
)


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


def training_changes(saved: dict | None, cfg: Config) -> list[str]:
    """config_changes outside SCHEDULE_KEYS and RESUMABLE_KEYS; a model key only where the weights keep their shapes
    (a change of shape is the weights' load to refuse: model_mismatch names it)."""
    if not saved:
        return []
    changes = [c for c in config_changes(saved, cfg)
               if not c.startswith(SCHEDULE_KEYS + RESUMABLE_KEYS + LOADER_KEYS) and not c.startswith("preset:")]
    if cfg.train.stages:  # the planner fits a table's run rows to the world size too, as schedule_changes' rows
        changes = [c for c in changes if not c.startswith("data.seq_len:")]
    if any(c.startswith("model.") for c in changes) and not _same_weight_shapes(saved, cfg):
        changes = [c for c in changes if not c.startswith("model.")]
    return changes


def _same_weight_shapes(saved: dict, cfg: Config) -> bool:
    from ..budget import meta_model
    from ..rundir.weights import shapes_of

    try:
        before = meta_model(config_from_dict(saved).model, 8).state_dict()
    except (ValueError, TypeError, RuntimeError):  # a saved config this version cannot build: the load says what
        return False
    return shapes_of(before) == shapes_of(meta_model(cfg.model, 8).state_dict())


def check_resume(cfg: Config, run_dir: Path, *, extend: bool = False) -> list[str]:
    """Before a resume of `run_dir` with the resolved `cfg`: ConfigError when the schedule or another training
    value (training_changes) would change without `extend`, RunComplete when the latest checkpoint is already the
    run's end. Returns the changes `extend` accepted ("key: checkpoint A, config B"). Nothing is checked without a
    checkpoint (loading it says what is wrong)."""
    found = RunDir(run_dir).list_checkpoints()
    if not found:
        return []
    state = read_state(found[-1])
    step, saved = int(state.get("step", 0)), _saved_config(run_dir, state)
    fixed = [c for c in config_changes(saved, cfg) if c.startswith(LOADER_KEYS)]
    if fixed:
        raise ConfigError(f"resuming {run_dir} at step {step} with {'; '.join(fixed)}: the run's data order from that "
                          f"step is saved for its own value, --extend or not; resume with the run's own values, or "
                          f"start a new run in another --run-dir")
    changes = schedule_changes(saved, cfg)
    if changes and not extend:
        raise ConfigError(f"resuming {run_dir} at step {step} with {'; '.join(changes)} would change its "
                          f"schedules from that step on{_lr_change(saved, cfg, step)}; add --extend to do so, "
                          f"or resume with the run's own values")
    others = training_changes(saved, cfg)
    if others and not extend:
        raise ConfigError(f"resuming {run_dir} at step {step} with {'; '.join(others)} would train differently from "
                          f"that step on, while its config.toml would say so from step 0; add --extend to do so (the "
                          f"resume's entry in env.json names the change), or resume with the run's own values")
    if extend and step > cfg.train.steps:  # it said "complete (step 4 of 2)", exit 0: the user's steps not taken
        raise ConfigError(f"resuming {run_dir} with --extend --train.steps={cfg.train.steps}: its checkpoint is at "
                          f"step {step} already, and a run cannot be shortened past it; give --train.steps > {step}")
    budget = cfg.train.time_budget_s
    budget_spent = bool(budget) and float(state.get("train_time_s", 0.0)) >= budget
    if (step == cfg.train.steps or budget_spent) and not validated_at(run_dir, step):
        # Stopped in its last step (or the step that spent its time budget): the signal's checkpoint came before the
        # final validation. Without it ab and sweep cannot use the run, and this resume is the only way to it: the
        # trainer validates and trains nothing (Trainer.run; SFT's run likewise).
        return changes + others
    if step >= cfg.train.steps:
        raise RunComplete(f"{run_dir} is complete (step {step} of {cfg.train.steps}); nothing to train. To train it "
                          f"further: speedgpt train --resume {run_dir} --train.steps=N --extend")
    if budget_spent:  # more steps cannot help: the budget stops the run before its next step (no --extend needed)
        further = f"--train.time_budget_s=S (more than {budget:g}, or 0 for no limit)"
        if extend:  # it said "complete", exit 0, the steps asked for not taken
            raise ConfigError(f"resuming {run_dir} with --extend: its time budget of {budget:g}s is spent, so it "
                              f"would train no step; add {further}")
        raise RunComplete(f"{run_dir} is complete (time budget of {budget:g}s spent); nothing to train. To train it "
                          f"further: speedgpt train --resume {run_dir} {further}")
    return changes + others


def validated_at(run_dir: Path, step: int) -> bool:
    """Whether the run's metrics hold its training's evaluation at `step`: pretraining's validation (not a `speedgpt
    eval` record) or SFT's held-out evaluation."""
    from ..rundir.metrics import ENDED_BY_STEPS, SFT_EVAL_EVENT, ended_by, read_metrics

    records = read_metrics(run_dir)
    return (ended_by(records, step) == ENDED_BY_STEPS
            or any(r.get("event") == SFT_EVAL_EVENT and r.get("step") == step for r in records))


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
