"""DTensor helpers for code that may hold FSDP's sharded parameters (the optimizers, checkpoints,
MoE balancing): whether a tensor is a shard, gathering one whole, sharding one like another. Apart
from parallel/fsdp.py so that these callers need not import the model that fsdp.py shards."""

from __future__ import annotations

import torch


def is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensor(t):
    """A DTensor gathered whole (a collective: every rank calls it in the same order); others as they are."""
    return t.full_tensor() if is_sharded(t) else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of a full tensor, as a DTensor placed like the DTensor `like` (no communication)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
