"""The trainer's validation loss: the first `val_tokens` tokens of the validation shards, scored
with the attention windows (and rotary state) of the training step the model has reached, so the
curve measures the model as it is trained."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DataConfig


def usable_val_tokens(d: DataConfig, val_files: list[Path], micro_batch: int, world_size: int, log) -> int:
    """data.val_tokens, rounded down to whole evaluation steps and capped by the val shards' size."""
    from ..data.shards import read_header

    step = (d.val_seq_len or d.seq_len) * micro_batch * world_size
    available = sum(read_header(f) for f in val_files) - 1
    tokens = min(d.val_tokens, available) // step * step
    if tokens <= 0:
        raise ValueError(f"the validation shards hold {available + 1:,} tokens, less than one evaluation step of "
                         f"{step:,}; add validation data or lower data.seq_len / data.val_seq_len")
    if tokens != d.val_tokens:
        log(f"validation: scoring {tokens:,} tokens (data.val_tokens={d.val_tokens:,}, "
            f"val shards hold {available + 1:,}, steps of {step:,})")
    return tokens


@torch.no_grad()
def validation_loss(model, forward, val_files: list[Path], *, seq_len: int, batch_size: int, max_tokens: int,
                    rank: int, world_size: int, device: torch.device, windows, rope) -> float:
    """Mean loss over the validation tokens and all ranks, with `forward` (the model, compiled or not)
    at the given windows and rotary state; `model` is put in eval mode for it."""
    from ..data.val import val_batches

    model.eval()
    losses = []
    for inputs, targets in val_batches(val_files, seq_len=seq_len, batch_size=batch_size, max_tokens=max_tokens,
                                       rank=rank, world_size=world_size, device=device):
        losses.append(forward(inputs, targets, windows=windows, rope=rope))
    model.train()
    loss = torch.stack(losses).mean()
    if world_size > 1:
        torch.distributed.all_reduce(loss)  # SUM, then divide: gloo has no AVG
        loss /= world_size
    return loss.item()
