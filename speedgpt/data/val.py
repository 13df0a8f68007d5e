"""Validation batches: the first N tokens of the val split as contiguous windows, the same every call."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .loader import _check_shape, _resolve
from .shards import load_shard, read_header
from .tokenizer import BOS_ID


def val_batches(
    files: list[Path] | str,
    *,
    seq_len: int,
    batch_size: int,
    max_tokens: int,
    rank: int = 0,
    world_size: int = 1,
    device: str | torch.device = "cpu",
    bos_id: int = BOS_ID,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic, finite: the same validation tokens every call, disjoint across ranks.

    Like the speedrun, validation scores exactly the first ``max_tokens`` tokens of the
    validation stream as contiguous windows (not BOS-aligned: nothing is cropped, so the
    loss is comparable with the speedrun's 3.28 target). Each step covers
    ``world_size * batch_size * seq_len`` tokens; rank r takes its consecutive part.
    ``bos_id`` is accepted for symmetry with TokenLoader; contiguous windows do not need it.
    Configuration errors are raised at call time, before any batch is made.
    """
    del bos_id
    _check_shape(batch_size, seq_len)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    step_tokens = world_size * batch_size * seq_len
    if max_tokens < step_tokens or max_tokens % step_tokens:
        fix = max(step_tokens, max_tokens // step_tokens * step_tokens)
        raise ValueError(
            f"val max_tokens={max_tokens:,} must be a positive multiple of world_size*batch_size*seq_len="
            f"{world_size}*{batch_size}*{seq_len}={step_tokens:,}; use max_tokens={fix:,}"
        )
    files = _resolve(files, "val")
    sizes = [read_header(f) for f in files]
    if sum(sizes) < max_tokens + 1:
        raise ValueError(
            f"val max_tokens={max_tokens:,} needs {max_tokens + 1:,} tokens (one extra for the last target), "
            f"but the {len(files)} val shards hold {sum(sizes):,}; lower max_tokens"
        )
    device = torch.device(device)
    return _val_iter(files, sizes, seq_len, batch_size, max_tokens, rank, world_size, device)


def _val_iter(files, sizes, seq_len, batch_size, max_tokens, rank, world_size, device):
    need = max_tokens + 1
    stream = np.empty(need, dtype=np.uint32)  # holds uint16 and uint32 (32-bit shards) ids
    filled = 0
    for f, n in zip(files, sizes):
        if filled == need:
            break
        tokens = load_shard(f).numpy()
        take = min(n, need - filled)
        stream[filled : filled + take] = tokens[:take]
        filled += take
    local = batch_size * seq_len
    for step in range(max_tokens // (world_size * local)):
        start = step * world_size * local + rank * local
        chunk = stream[start : start + local + 1]
        inputs = torch.from_numpy(chunk[:-1].astype(np.int32).reshape(batch_size, seq_len))
        targets = torch.from_numpy(chunk[1:].astype(np.int64).reshape(batch_size, seq_len))
        if device.type != "cpu":
            inputs = inputs.pin_memory().to(device, non_blocking=True)
            targets = targets.pin_memory().to(device, non_blocking=True)
        yield inputs, targets
