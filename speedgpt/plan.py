"""The run's plan: what a resolved config will do on a world size, derived once.

A `RunPlan` holds the resolved config (a budget's steps and batch written in, the stage table
concrete: what the run's config.toml keeps) and everything derived from it: the stage table with
each stage's rows per micro-step and micro-steps, the run's own micro-batching (validation uses
it), and as functions of the step the attention windows, YaRN's rotary state, the MTP weights and
the lr, Muon momentum and weight-decay multipliers. Commands read these from the plan instead of
deriving them again. The plan is derived, never saved as config: plan.json in a run directory is a
record of it for the user, and the config alone reproduces it.

`planner.plan_run(cfg, world_size)` makes the plan of a run about to start (its budget resolved
once, then `validate`); `RunPlan.of(cfg)` the plan of a config that is already resolved (a run's
config.toml, a checkpoint's), without validating it again.

`validate(cfg, world_size)` checks a config whole: its sections (config.check_config), then the
stage table derived from it (stages.check_stages) and the switches that read that table
(config/switch_bases.py), handed the table rather than deriving it again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .config import Config, check_config, micro_batch_rows
from .config.switch_bases import check_switch_bases
from .optim.schedules import attention_windows, lr_multiplier, muon_momentum, muon_weight_decay
from .stages import Stage, StagePlan, check_stages, resolve_stage_table, stage_micro_batch, stage_plan

PLAN_FORMAT = "speedgpt.plan/1"


def validate(cfg: Config, world_size: int = 1) -> StagePlan:
    """Raise ConfigError for the first inconsistent value (section by section, then the stage
    table, then switches without their base); return the run's stage table."""
    check_config(cfg, world_size)
    table = check_stages(cfg, world_size)
    check_switch_bases(cfg, table, RunPlan(cfg, world_size, table).windows_at)  # last: it reads the table
    return table


@dataclass(frozen=True)
class RunPlan:
    """What a run does: its resolved config on `world_size` ranks, its stage table, and every
    per-step value as a function of the step (module docstring)."""

    cfg: Config  # resolved: what the run's config.toml keeps
    world_size: int
    table: StagePlan
    budget_lines: tuple[str, ...] = ()  # what resolving the budget derived (planner.plan_run)

    @classmethod
    def of(cls, cfg: Config, world_size: int = 1, budget_lines: tuple[str, ...] = ()) -> RunPlan:
        """The plan of an already resolved config (budget numbers and stage table written in)."""
        return cls(cfg, world_size, stage_plan(cfg), tuple(budget_lines))

    @classmethod
    def resolved(cls, cfg: Config, world_size: int, table: StagePlan, budget_lines=()) -> RunPlan:
        """The plan of a validated config whose stage table is `table`: the table's rows are
        written into the config (concrete values, as config.toml keeps them), and the plan is that
        config's (its stages' rows are the concrete ones a stage hook reads)."""
        return cls.of(resolve_stage_table(cfg, table), world_size, budget_lines)

    # ------------------------------------------------------------------ the stage table
    @property
    def steps(self) -> int:
        return self.cfg.train.steps

    @property
    def stages(self) -> tuple[Stage, ...]:
        return self.table.stages

    @property
    def from_table(self) -> bool:
        return self.table.from_table

    @property
    def has_mtp(self) -> bool:
        return self.table.has_mtp

    def stage_at(self, step: int) -> Stage:
        return self.table.stage_at(step)

    # The batching, worked out when first read (a plan made only for its windows, as the model's
    # runtime makes one, never needs it; plan_run reads it, so a batch the ranks cannot share fails there).
    @functools.cached_property
    def _run_batch(self) -> tuple[int, int]:
        return micro_batch_rows(self.cfg, self.world_size)

    @property
    def micro_batch(self) -> int:
        """The run's own rows per micro-step per rank (validation batches with it)."""
        return self._run_batch[0]

    @property
    def grad_accum(self) -> int:
        """The run's own micro-steps per step."""
        return self._run_batch[1]

    @functools.cached_property
    def stage_batches(self) -> tuple[tuple[int, int], ...]:
        """Each stage's (rows per micro-step per rank, micro-steps)."""
        return tuple(stage_micro_batch(self.cfg, stage, self.world_size) for stage in self.stages)

    def stage_batch(self, stage: Stage) -> tuple[int, int]:
        """(rows per micro-step per rank, micro-steps) of `stage`."""
        return self.stage_batches[stage.index]

    def max_seq_len(self) -> int:
        return self.table.max_seq_len()

    def min_batch_tokens(self) -> int:
        return self.table.min_batch_tokens()

    def as_records(self) -> list[dict]:
        return self.table.as_records()

    # ------------------------------------------------------------------ per step
    def windows_at(self, step: int) -> tuple[int, int]:
        """(long, short) attention windows of training step `step` (and of the validation after
        `step` steps): its stage's, or the window schedule's."""
        return self.stage_at(step).windows or attention_windows(self.cfg.schedule, step, self.steps)

    def mtp_weights_at(self, step: int) -> tuple[float, ...]:
        return self.stage_at(step).mtp_weights_at(step)

    def lr_mult_at(self, step: int) -> float:
        """Step `step`'s multiplier of every base learning rate: the schedule's, times the stage's
        lr_mul (x 1.0 exactly without a stage table)."""
        return lr_multiplier(self.cfg.schedule, step, self.steps) * self.stage_at(step).lr_mul

    def muon_momentum_at(self, step: int) -> float:
        o = self.cfg.optim
        return muon_momentum(step, o.muon_momentum_start, o.muon_momentum, o.muon_momentum_warmup_steps)

    def muon_weight_decay_at(self, step: int) -> float:
        o = self.cfg.optim
        return muon_weight_decay(o.muon_weight_decay, o.wd_schedule, self.lr_mult_at(step), step / self.steps)

    @functools.cached_property
    def yarn(self):
        """model.yarn: YaRN's rotary state of every step (model/yarn.py), None without it."""
        if not self.cfg.model.yarn:
            return None
        from .model.yarn import YarnSchedule

        return YarnSchedule.for_windows(self.cfg.model, lambda s: self.windows_at(s)[0], self.steps)

    # ------------------------------------------------------------------ what the user sees
    def batch_lines(self) -> list[str]:
        """The batch of a step (or the stage table, one line per stage), as printed at start."""
        if self.from_table:
            lines = [f"stages: {len(self.stages)} over {self.steps} steps"]
            for s in self.stages:
                rows, accum = self.stage_batch(s)
                windows = f"{s.windows[0]}/{s.windows[1]}" if s.windows else "schedule"
                ramp = "" if s.mtp_weights == s.mtp_weights_end else f"->{_fmt(s.mtp_weights_end)}"
                mtp = _fmt(s.mtp_weights) + ramp
                docs = f" | documents <= {s.max_doc_len}" if s.max_doc_len else ""
                lines.append(f"  stage {s.index}: steps {s.start}-{s.end - 1} | batch {s.batch_tokens} tokens = "
                             f"{self.world_size} rank(s) x {accum} micro-step(s) x {rows} row(s) x {s.seq_len}{docs} | "
                             f"windows {windows} | mtp {mtp} | lr x{s.lr_mul:g}")
            return lines
        return [f"batch: {self.cfg.train.batch_tokens} tokens/step = {self.world_size} rank(s) x {self.grad_accum} "
                f"micro-step(s) x {self.micro_batch} row(s) x {self.cfg.data.seq_len} tokens"]

    def window_changes(self) -> list[list[int]]:
        """[step, long, short] at step 0 and at every step whose windows differ from the step before."""
        out, last = [], None
        for step in range(self.steps + 1):
            windows = self.windows_at(step)
            if windows != last:
                out.append([step, *windows])
                last = windows
        return out

    def as_dict(self) -> dict:
        """The plan as plain data (plan.json in the run directory): a record of what the run does."""
        sched = self.cfg.schedule
        return {
            "format": PLAN_FORMAT,
            "world_size": self.world_size,
            "steps": self.steps,
            "batch_tokens": self.cfg.train.batch_tokens,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "budget": list(self.budget_lines),
            "printed": self.batch_lines(),
            "stages": [{**record, "rows": rows, "micro_steps": accum}
                       for record, (rows, accum) in zip(self.as_records(), self.stage_batches)],
            "window_changes": self.window_changes(),
            "lr_schedule": {"kind": sched.kind, "warmup_frac": sched.warmup_frac,
                            "cooldown_frac": sched.cooldown_frac, "final_lr_frac": sched.final_lr_frac},
        }


def _fmt(weights: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{w:g}" for w in weights) + "]"
