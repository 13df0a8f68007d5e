"""What the schedules give training step k: its hyperparameters, set on the optimizers, and its
attention windows, rotary (YaRN) state and multi-token-prediction weights in the form the forward
takes.

Everything here is read from the run's plan (plan.py), a pure function of the step, so a resumed
run recomputes it exactly. Under compile the per-step values enter the model as device tensors,
each distinct value copied once: the compiled graph sees neither new Python values (no recompiles
as the windows grow) nor a host-to-device copy (no sync) inside the timed steps.
"""

from __future__ import annotations

import torch

from ..plan import RunPlan


def apply_hyperparameters(optimizers, plan: RunPlan, step: int, lr_scale: float = 1.0) -> None:
    """Set step `step`'s learning rates (the schedule x the stage's lr_mul x `lr_scale`, which numerics
    rollbacks lower), Muon momentum and weight decay on every optimizer's param groups."""
    mult = plan.lr_mult_at(step)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * mult
    momentum, weight_decay = plan.muon_momentum_at(step), plan.muon_weight_decay_at(step)
    for group in optimizers.muon.param_groups if optimizers.muon is not None else []:
        group["momentum"] = momentum
        group["weight_decay"] = weight_decay
    if lr_scale != 1.0:
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] *= lr_scale


class StepInputs:
    """The forward's per-step inputs from the plan: windows, rope and MTP weights of a step."""

    def __init__(self, plan: RunPlan, device: torch.device, rope_state=None):
        """`rope_state`: the model's GPT.rope_state (YaRN's state of a step in the form forward takes it)."""
        self.plan, self.device = plan, device
        self.compile = plan.cfg.train.compile
        self._window_tensors: dict[tuple[int, int], torch.Tensor] = {}
        self._mtp_tensors = self._mtp_weight_tensors()
        self.yarn = plan.yarn  # model.yarn: the rotary state of every step (model/yarn.py)
        self.rope_state = rope_state
        self._rope: tuple[int, object] | None = None  # (state index, its RopeState): the state in use
    def _mtp_weight_tensors(self) -> list[torch.Tensor | None]:
        """Every step's multi-token-prediction weights as its own device tensor, made once before
        training (None for steps that predict the next token only). Every MTP stage's weights have the
        length of the run's longest (zeros after its own): the count is a shape, so stages of 3 and of 2
        weights would compile a graph each. A zero weight's term is an exact 0 in the loss and its gradient
        (the reference loss sums its terms in another order: equal to float rounding), and the fused loss
        costs the same for 2 or 3 targets (docs/benchmarks.md, "fused MTP").
        A next-token-only stage gets weights too, (1, 0, ...), when its micro-batch has the shape of an MTP
        stage's: without them the forward takes the plain loss, a graph of its own (wave 13: speedrun-latest in
        rows of 1 x 32,768 everywhere still compiled stage 2 apart). With rows of another shape it recompiles
        anyway, so it keeps the plain loss: the fused op scores three targets ~4 % slower a token than one
        (docs/benchmarks.md: 10.16 ms at 32,768 rows against 14.63 ms for one target at 49,152)."""
        if not self.plan.has_mtp:
            return []
        width = max(stage.predicts for stage in self.plan.stages)
        mtp_shapes = {self._micro_batch_shape(stage) for stage in self.plan.stages if stage.predicts > 1}
        out: list[torch.Tensor | None] = []
        for stage in self.plan.stages:
            if stage.predicts == 1 and self._micro_batch_shape(stage) not in mtp_shapes:
                out += [None] * stage.steps
                continue
            pad = (0.0,) * (width - stage.predicts)
            table = torch.tensor([stage.mtp_weights_at(step) + pad for step in range(stage.start, stage.end)],
                                 dtype=torch.float32, device=self.device)
            out += [row.clone() for row in table]  # separate tensors: a compiled graph sees the same layout each step
        return out

    def _micro_batch_shape(self, stage) -> tuple[int, int]:
        """(rows, tokens a row) of one micro-step of `stage` on this run's ranks: a compiled graph's input shape."""
        return self.plan.stage_batch(stage)[0], stage.seq_len

    def mtp_weights_at(self, step: int) -> torch.Tensor | None:
        """Step `step`'s MTP weights; None when it predicts the next token only."""
        return self._mtp_tensors[step] if self._mtp_tensors else None

    def windows_at(self, step: int):
        """The attention windows of `step` in the form the forward takes: the schedule's (long, short)
        tokens; under compile a device tensor. Training step k and the validation after k steps both
        use them, so validation scores the model with the windows it is trained at (as record #28)."""
        windows = self.plan.windows_at(step)
        if not self.compile:
            return windows
        # A compiled graph specializes on Python ints: windows enter as device tensors so the growing
        # window schedule does not recompile. Cached, so each distinct value is copied to the device once.
        if windows not in self._window_tensors:
            self._window_tensors[windows] = torch.tensor(windows, dtype=torch.int32, device=self.device)
        return self._window_tensors[windows]

    def rope_at(self, step: int):
        """YaRN's state of `step` as device tensors (model/yarn.py RopeState, so the compiled model does not
        recompile as it changes); None without YaRN. Only the state in use is kept: its tables are a few hundred
        MiB at long validation rows, and made again in milliseconds when a step goes back to an earlier state
        (the warmup)."""
        if self.yarn is None:
            return None
        if self.rope_state is None:
            raise ValueError("StepInputs.rope_at: a YaRN run's steps need rope_state (the model's GPT.rope_state)")
        key = self.yarn.index(step)
        if self._rope is None or self._rope[0] != key:
            self._rope = None  # the old state's tables freed before the new ones are made
            self._rope = (key, self.rope_state(*self.yarn.state(step)))
        return self._rope[1]
