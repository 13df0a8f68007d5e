"""Numerics guard: non-finite losses and gradients, found without a host sync per step.

Every step adds device-side work only: `~isfinite(loss)` (and of the gradient norm when it is
computed) folded into a device flag holding the first bad step. The host reads it on logging and
checkpoint steps (which sync anyway), so a NaN is acted on at the latest at the next logging step,
and never written into a checkpoint. `train.on_nonfinite` chooses what happens:

* `abort` (default): stop with an error naming the step, the rank and the last good checkpoint.
* `skip`: the step's update is not applied. The flag is combined over ranks on the device (one
  tiny all-reduce per step, no host sync) and the parameters and optimizer state are restored
  from a copy taken before the step, with `torch.where` on the device. State the step created
  (the first step's momentum buffers) is zeroed, as it was before. Integer step counters (torch
  AdamW's `step`) still advance, so bias correction acts as if the step happened. The copy costs
  one extra read and write of parameters and optimizer state per step: the price of skipping
  without a sync. Skipped steps are counted in metrics.jsonl (`skipped_steps`).
* `rollback`: reload the newest checkpoint and continue with every learning rate multiplied by
  `train.rollback_lr_factor` (kept in later checkpoints), at most `train.max_rollbacks` times.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

MODES = ("abort", "skip", "rollback")


class NonFiniteError(FloatingPointError):
    """Training met a non-finite loss or gradient and train.on_nonfinite says abort (or rollbacks ran out)."""


def _local_grads(optimizers) -> list[torch.Tensor]:
    parts = []
    for opt in optimizers:
        if hasattr(opt, "reduced_grads"):  # sharded: this rank's part of the averaged gradients
            parts += [g for g in opt.reduced_grads() if g is not None]
        else:
            parts += [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
    return parts


def nonfinite_grads(optimizers) -> torch.Tensor | None:
    """A device flag, True when a gradient this rank holds is not finite (one fused norm, no host sync); None when
    there is no gradient. NumericsGuard's skip mode and SFT's stop read it."""
    grads = _local_grads(optimizers)
    return ~torch.isfinite(torch.stack(torch._foreach_norm(grads))).all() if grads else None


def _float_state(optimizers) -> list[torch.Tensor]:
    state = [t for opt in optimizers for st in opt.state.values() for t in st.values()
             if torch.is_tensor(t) and t.is_floating_point()]
    return state + list(getattr(optimizers, "pending", {}).values())  # Adam's waiting gradients (adam_every)


class NumericsGuard:
    def __init__(self, mode: str, device: torch.device, rank: int, world_size: int):
        self.mode, self.device, self.rank, self.world_size = mode, device, rank, world_size
        self.reset()

    @property
    def reads_gradients(self) -> bool:
        """Whether `observe` reads the reduced gradients every step (skip mode, when no norm is computed)."""
        return self.mode == "skip"

    def reset(self) -> None:
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=self.device)
        self.skipped = torch.zeros((), dtype=torch.int64, device=self.device)

    def observe(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None = None,
                optimizers=None) -> torch.Tensor:
        """The step's device flag (True: non-finite); recorded, never read here."""
        bad = ~torch.isfinite(loss)
        if grad_norm is not None:
            bad = bad | ~torch.isfinite(grad_norm)
        elif optimizers is not None:  # skip mode must see a bad gradient at the step it happens
            bad_grads = nonfinite_grads(optimizers)
            if bad_grads is not None:
                bad = bad | bad_grads
        if self.mode == "skip" and self.world_size > 1:
            flag = bad.float()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank skips the same steps
            bad = flag > 0
        self.first_bad = torch.where(bad & (self.first_bad < 0), torch.full_like(self.first_bad, step),
                                     self.first_bad)
        return bad

    @torch.no_grad()
    def masked_step(self, optimizers, bad: torch.Tensor, step: int | None = None) -> None:
        """The optimizers' step (`optimizers.step(step)`: the container), undone on the device where `bad` is True."""
        params = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
        before = _float_state(optimizers)
        known = {id(t) for t in before}
        saved = [t.clone() for t in params + before]
        optimizers.step(step)
        for t, s in zip(params + before, saved):
            t.copy_(torch.where(bad, s, t))
        for t in _float_state(optimizers):
            if id(t) not in known:  # created by this step: as if it never ran
                t.copy_(torch.where(bad, torch.zeros_like(t), t))
        self.skipped += bad.to(torch.int64)
        self.first_bad.fill_(-1)  # a skipped step is handled, not a reason to stop

    def first_bad_by_rank(self) -> dict[int, int]:
        """{rank: first bad step} over all ranks (host read; a collective on several ranks)."""
        if self.world_size == 1:
            step = int(self.first_bad.item())
            return {0: step} if step >= 0 else {}
        slots = torch.full((self.world_size,), -1, dtype=torch.int64, device=self.device)
        slots[self.rank] = self.first_bad
        dist.all_reduce(slots, op=dist.ReduceOp.MAX)
        return {r: int(s) for r, s in enumerate(slots.tolist()) if s >= 0}
