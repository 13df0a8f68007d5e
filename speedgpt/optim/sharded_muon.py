"""Muon on FSDP-sharded parameters (DTensors, each rank holding a slice of dim 0).

Momentum, weight decay and the parameter update are elementwise, so they run on each rank's
shard. Orthogonalization needs whole matrices, and is spread over the ranks: the matrices are
taken W at a time, matrix j of each group belongs to rank j, and one all-to-all brings every
rank's slice of matrix j to rank j, which orthogonalizes it; a second all-to-all sends each rank
its slice of every result. Communication: two all-to-alls of the momentum directions (as much as
one all-gather), and each rank runs 1/W of the Newton-Schulz work.

With NorMuon on, whose per-row second moments would then live on the owning rank only, every
rank instead gathers each whole matrix (`full_tensor`) and orthogonalizes all of them, keeping
those moments whole on every rank (simple and exact; W times the Newton-Schulz work).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..parallel.dtensor import full_tensor, is_sharded, shard_like
from .muon import Muon, orthogonalize


def _rows(n: int, world: int) -> list[int]:
    """Rows of dim 0 each rank holds under Shard(0) (torch.chunk's split: ceil(n/W) each, the rest last)."""
    c = math.ceil(n / world)
    return [max(0, min(c, n - r * c)) for r in range(world)]


class ShardedMuon(Muon):
    """Muon whose parameters may be DTensors; same math and state names as Muon."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            # On the shards, one parameter at a time: multi-tensor ops refuse a list that mixes DTensors and
            # plain tensors (the unsharded branch below); the FSDP step is not short of launches.
            dirs = [self.momentum_directions([p], [p.grad], group)[0] for p in params]
            if group["normuon"] or not all(is_sharded(p) for p in params):
                for p, d in zip(params, dirs):
                    whole = orthogonalize(full_tensor(d), group["ortho"], group["ns_steps"], group.get("ns_fused", False))
                    (update,) = self.normalize([p], [whole], group)
                    self.apply_update(p, shard_like(update.to(p.dtype), p) if is_sharded(p) else update, group)
                continue
            for start in range(0, len(params), self._world(params)):
                chunk = slice(start, start + self._world(params))
                self._spread_step(params[chunk], dirs[chunk], group)

    @staticmethod
    def _world(params) -> int:
        return params[0].device_mesh.size() if params else 1

    def _spread_step(self, params: list, dirs: list, group: dict) -> None:
        """Orthogonalize up to W matrices, matrix j on rank j, and apply each rank's slices."""
        mesh = params[0].device_mesh
        world, rank = mesh.size(), mesh.get_local_rank()
        pg = mesh.get_group()
        local = [d.to_local() for d in dirs]
        rows = [_rows(p.shape[0], world) for p in params]
        row_numel = [math.prod(p.shape[1:]) for p in params]
        dtype = local[0].dtype
        device = local[0].device
        # 1) every rank sends its slice of matrix j to rank j
        send = torch.cat([x.reshape(-1).to(dtype) for x in local])
        send_sizes = [x.numel() for x in local] + [0] * (world - len(local))
        mine = rank < len(params)
        recv_sizes = [rows[rank][r] * row_numel[rank] for r in range(world)] if mine else [0] * world
        recv = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
        self._all_to_all(recv, send, recv_sizes, send_sizes, pg)
        # 2) rank j orthogonalizes matrix j
        if mine:
            p = params[rank]
            whole = recv.view(p.shape)
            result = orthogonalize(whole, group["ortho"], group["ns_steps"], group.get("ns_fused", False))
            result = result.to(dtype).reshape(-1)
        else:
            result = torch.empty(0, dtype=dtype, device=device)
        # 3) rank j sends every rank its slice of the result; each rank gets its slice of every matrix
        back_send_sizes = recv_sizes
        back_recv_sizes = [x.numel() for x in local] + [0] * (world - len(local))
        back = torch.empty(sum(back_recv_sizes), dtype=dtype, device=device)
        self._all_to_all(back, result.contiguous(), back_recv_sizes, back_send_sizes, pg)
        from torch.distributed.tensor import DTensor

        for p, x, part in zip(params, local, back.split(back_recv_sizes[:len(params)])):
            update = DTensor.from_local(part.view(x.shape).to(p.dtype), p.device_mesh, p.placements,
                                        shape=p.shape, stride=p.stride(), run_check=False)
            self.apply_update(p, update, group)

    @staticmethod
    def _all_to_all(out: torch.Tensor, inp: torch.Tensor, out_sizes: list[int], in_sizes: list[int], pg) -> None:
        if dist.get_world_size(pg) == 1:
            out.copy_(inp)
            return
        dist.all_to_all_single(out, inp, output_split_sizes=out_sizes, input_split_sizes=in_sizes, group=pg)
