"""Muon on FSDP-sharded parameters (DTensors, each rank holding a slice of dim 0).

Momentum, weight decay and the parameter update are elementwise, so they run on each rank's shard
as DTensor operations. Orthogonalization needs the whole matrix: each matrix's momentum direction is
gathered (`full_tensor`, an all-gather), orthogonalized, and each rank keeps its own slice of the
result (no further communication). NorMuon's per-row second moments are kept whole on every rank
(small: one value per row). Every rank orthogonalizes every matrix: simple and exact, at the cost
of compute that a split of the matrices over ranks (with a scatter of the results) would divide by
the world size; at the sizes FSDP is for, Newton-Schulz is a few percent of the step.
"""

from __future__ import annotations

import torch

from ..parallel.fsdp import full_tensor, is_sharded, shard_like
from .muon import Muon, orthogonalize


class ShardedMuon(Muon):
    """Muon whose parameters may be DTensors; same math, same state names as Muon."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                direction = self.momentum_direction(p, p.grad, group)  # on the shard
                whole = full_tensor(direction)  # a collective: every rank visits the same params in order
                update = self.normalize(p, orthogonalize(whole, group["ortho"], group["ns_steps"]), group)
                if is_sharded(p):
                    update = shard_like(update.to(p.dtype), p)
                self.apply_update(p, update, group)

    def normalize(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> torch.Tensor:
        if not group["normuon"]:
            return update
        state = self.state[p]
        if "second_momentum_buffer" not in state:
            shape, dtype = self.state_layout(p)["second_momentum_buffer"]
            state["second_momentum_buffer"] = torch.zeros(shape, dtype=dtype, device=update.device)
        from .muon import normuon_normalize

        return normuon_normalize(update, state["second_momentum_buffer"], group["normuon_beta2"])
