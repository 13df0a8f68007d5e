"""The trainer's validation loss: the first `val_tokens` tokens of the validation shards, scored
with the attention windows (and rotary state) of the training step the model has reached, so the
curve measures the model as it is trained."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DataConfig
from ..parallel.dist import DistInfo


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


class Validator:
    """Scores a model on this rank's share of the validation tokens, averaged over the ranks. Made in
    setup, so a validation set too small for one evaluation step fails before the model is built."""

    def __init__(self, d: DataConfig, val_files: list[Path], micro_batch: int, dist: DistInfo, log):
        self.val_files, self.micro_batch, self.dist = val_files, micro_batch, dist
        self.seq_len = d.val_seq_len or d.seq_len
        self.tokens = usable_val_tokens(d, val_files, micro_batch, dist.world_size, log)

    @torch.no_grad()
    def loss(self, model, forward, windows, rope) -> float:
        """Mean loss with `forward` (the model, compiled or not) at the given windows and rotary state;
        `model` is in eval mode meanwhile."""
        from ..data.val import val_batches

        model.eval()
        losses = []
        for inputs, targets in val_batches(self.val_files, seq_len=self.seq_len, batch_size=self.micro_batch,
                                           max_tokens=self.tokens, rank=self.dist.rank,
                                           world_size=self.dist.world_size, device=self.dist.device):
            losses.append(forward(inputs, targets, windows=windows, rope=rope))
        model.train()
        loss = torch.stack(losses).mean()
        if self.dist.world_size > 1:
            torch.distributed.all_reduce(loss)  # SUM, then divide: gloo has no AVG
            loss /= self.dist.world_size
        return loss.item()
