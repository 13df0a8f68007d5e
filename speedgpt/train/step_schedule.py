"""What the schedules give training step k: its hyperparameters, set on the optimizers, and its
attention windows, rotary (YaRN) state and multi-token-prediction weights in the form the forward
takes.

Everything here is a pure function of the step (and the stage table), so a resumed run recomputes
it exactly. Under compile the per-step values enter the model as device tensors, each distinct
value copied once: the compiled graph sees neither new Python values (no recompiles as the
windows grow) nor a host-to-device copy (no sync) inside the timed steps.
"""

from __future__ import annotations

import torch

from ..config import Config
from ..optim.schedules import lr_multiplier, muon_momentum, muon_weight_decay
from ..stages import StagePlan, windows_at


def lr_mult_at(cfg: Config, plan: StagePlan, step: int) -> float:
    """Step `step`'s multiplier of every base learning rate: the schedule's, times the stage's lr_mul
    (x 1.0 exactly without a stage table)."""
    return lr_multiplier(cfg.schedule, step, cfg.train.steps) * plan.stage_at(step).lr_mul


def apply_hyperparameters(optimizers, cfg: Config, plan: StagePlan, step: int, lr_scale: float = 1.0) -> None:
    """Set step `step`'s learning rates (the schedule x the stage's lr_mul x `lr_scale`, which numerics
    rollbacks lower), Muon momentum and weight decay on every optimizer's param groups."""
    mult = lr_mult_at(cfg, plan, step)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * mult
    o = cfg.optim
    momentum = muon_momentum(step, o.muon_momentum_start, o.muon_momentum, o.muon_momentum_warmup_steps)
    weight_decay = muon_weight_decay(o.muon_weight_decay, o.wd_schedule, mult, step / cfg.train.steps)
    for group in optimizers.muon.param_groups if optimizers.muon is not None else []:
        group["momentum"] = momentum
        group["weight_decay"] = weight_decay
    if lr_scale != 1.0:
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] *= lr_scale


class StepInputs:
    """The forward's per-step inputs from the schedules: windows, rope and MTP weights of a step."""

    def __init__(self, cfg: Config, plan: StagePlan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device
        self._window_tensors: dict[tuple[int, int], torch.Tensor] = {}
        self._mtp_tensors = self._mtp_weight_tensors()
        self.yarn = None  # model.yarn: the rotary state of every step (model/yarn.py), as device tensors per state
        if cfg.model.yarn:
            from ..model.yarn import YarnSchedule

            self.yarn, self._yarn_tensors = YarnSchedule.from_config(cfg), {}

    def _mtp_weight_tensors(self) -> list[torch.Tensor | None]:
        """Every step's multi-token-prediction weights as its own device tensor, made once before
        training (None for steps that predict the next token only)."""
        if not self.plan.has_mtp:
            return []
        out: list[torch.Tensor | None] = []
        for stage in self.plan.stages:
            if stage.predicts == 1:
                out += [None] * stage.steps
                continue
            table = torch.tensor([stage.mtp_weights_at(step) for step in range(stage.start, stage.end)],
                                 dtype=torch.float32, device=self.device)
            out += [row.clone() for row in table]  # separate tensors: a compiled graph sees the same layout each step
        return out

    def mtp_weights_at(self, step: int) -> torch.Tensor | None:
        """Step `step`'s MTP weights; None when it predicts the next token only."""
        return self._mtp_tensors[step] if self._mtp_tensors else None

    def windows_at(self, step: int):
        """The attention windows of `step` in the form the forward takes: the schedule's (long, short)
        tokens; under compile a device tensor. Training step k and the validation after k steps both
        use them, so validation scores the model with the windows it is trained at (as record #28)."""
        windows = windows_at(self.cfg, step, self.plan)
        if not self.cfg.train.compile:
            return windows
        # A compiled graph specializes on Python ints: windows enter as device tensors so the growing
        # window schedule does not recompile. Cached, so each distinct value is copied to the device once.
        if windows not in self._window_tensors:
            self._window_tensors[windows] = torch.tensor(windows, dtype=torch.int32, device=self.device)
        return self._window_tensors[windows]

    def rope_at(self, step: int):
        """YaRN's (frequencies, attention-scale multiplier) of `step` as device tensors (so the compiled
        model does not recompile as they change), each state copied to the device once; None without YaRN."""
        if self.yarn is None:
            return None
        key = self.yarn.index(step)
        if key not in self._yarn_tensors:
            self._yarn_tensors[key] = self.yarn.tensors(step, self.device)
        return self._yarn_tensors[key]
