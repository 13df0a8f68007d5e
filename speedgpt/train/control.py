"""Decisions taken between steps that every rank must take alike (or their collectives would no
longer match): stop on a signal, save on the clock (train.checkpoint_every_min), stop at the time
budget (train.time_budget_s)."""

from __future__ import annotations

import signal
import time

import torch

from ..config import TrainConfig
from ..parallel.dist import DistInfo
from .preempt import StopRequest


class RunControl:
    def __init__(self, t: TrainConfig, dist: DistInfo, stop_request: StopRequest):
        self.t, self.dist, self.stop_request = t, dist, stop_request
        # Stop and save decisions travel on a CPU (gloo) group: combining them every step costs no
        # device sync, and all ranks stop or save at the same step.
        self.group = torch.distributed.new_group(backend="gloo") if dist.world_size > 1 else None

    def after_step(self, last_save_time: float) -> tuple[bool, bool]:
        """(stop on a signal, time-based checkpoint due) after a step, the same on every rank: the
        flags are combined on the CPU group (any rank's signal stops all; rank 0's clock decides
        the save), so this costs no device sync."""
        signalled = bool(self.stop_request.signum)
        minutes = self.t.checkpoint_every_min
        due = bool(minutes) and self.dist.is_main and time.monotonic() - last_save_time >= minutes * 60
        if self.dist.world_size == 1:
            return signalled, due
        flags = torch.tensor([float(signalled), float(due)])
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=self.group)
        if flags[0] and not self.stop_request.signum:
            self.stop_request.signum = signal.SIGTERM  # another rank was signalled
        return bool(flags[0]), bool(flags[1])

    def budget_spent(self, step: int, train_time: float) -> bool:
        """Whether train.time_budget_s is used up. Every rank must stop at the same step, so on several
        ranks rank 0's clock decides, read on logging steps only: that keeps the broadcast, a host sync,
        off the other steps."""
        if self.dist.world_size == 1:
            return train_time >= self.t.time_budget_s
        if step % self.t.log_every:
            return False
        flag = torch.tensor([float(train_time >= self.t.time_budget_s)], device=self.dist.device)
        torch.distributed.broadcast(flag, src=0)
        return bool(flag.item())
