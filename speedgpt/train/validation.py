"""The trainer's validation loss: the first `val_tokens` tokens of the validation shards, scored
with the attention windows (and rotary state) of the training step the model has reached, so the
curve measures the model as it is trained."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DataConfig
from ..parallel.dist import DistInfo


def usable_val_tokens(d: DataConfig, val_files: list[Path], log) -> int:
    """data.val_tokens, rounded down to whole rows of data.val_seq_len and capped by the val shards' size.
    The world size and micro-batch do not enter: every run of a config scores the same tokens."""
    from ..data.shards import read_header

    row = d.val_seq_len or d.seq_len
    available = sum(read_header(f) for f in val_files) - 1
    tokens = min(d.val_tokens, available) // row * row
    if d.val_tokens < row:
        raise ValueError(f"data.val_tokens={d.val_tokens:,} is less than one validation row of {row:,} tokens; give "
                         f"at least {row:,} (data.val_seq_len, or data.seq_len, sets the row)")
    if tokens <= 0:
        raise ValueError(f"the validation shards hold {available + 1:,} tokens, less than one row of {row:,}; "
                         f"add validation data or lower data.seq_len / data.val_seq_len")
    if tokens != d.val_tokens:
        log(f"validation: scoring {tokens:,} tokens (data.val_tokens={d.val_tokens:,}, "
            f"val shards hold {available + 1:,}, rows of {row:,})")
    return tokens


class Validator:
    """Scores a model on this rank's share of the validation rows; the mean over all rows is the same
    whatever the world size. Made in setup, so a validation set too small for one row, or one holding an
    id >= `vocab_size` (model.vocab_size: the tokenizer's), fails before the run directory is written."""

    def __init__(self, d: DataConfig, val_files: list[Path], micro_batch: int, dist: DistInfo, log, *,
                 vocab_size: int):
        from ..data.val import check_val_ids

        self.val_files, self.micro_batch, self.dist = val_files, micro_batch, dist
        self.seq_len = d.val_seq_len or d.seq_len
        self.tokens = usable_val_tokens(d, val_files, log)
        check_val_ids(val_files, self.tokens + 1, vocab_size)  # the ids the model's table must hold

    @property
    def largest_batch_rows(self) -> int:
        """The rows of the largest batch any rank scores: rank 0's first, as rank_val_batches deals them (rank 0 holds
        the most rows; at least 1: a rank short of rows scores a one-row batch)."""
        from ..data.val import batch_rows

        return max(1, batch_rows(self.tokens // self.seq_len, self.dist.world_size, self.micro_batch, 0)[0])

    @torch.no_grad()
    def loss(self, model, forward, windows, rope, *, warmup: bool = False) -> float:
        """Mean loss with `forward` (the model, compiled or not) at the given windows and rotary state;
        `model` is in eval mode meanwhile. `warmup`: only one batch of each shape the ranks meet, which compiles
        every validation graph in a fraction of a whole validation's time (the speedrun presets score 40 rows of
        262,144 tokens: seconds of every start); what it returns is then not the validation loss."""
        from ..data.val import batches_of_each_shape, rank_val_batches

        model.eval()
        weighted, rows = [], self.tokens // self.seq_len
        only = batches_of_each_shape(rows, self.dist.world_size, self.micro_batch) if warmup else None
        for inputs, targets, real in rank_val_batches(self.val_files, seq_len=self.seq_len,
                                                      batch_size=self.micro_batch, rows=rows, rank=self.dist.rank,
                                                      world_size=self.dist.world_size, device=self.dist.device,
                                                      only=only):
            weighted.append(forward(inputs, targets, windows=windows, rope=rope) * real)
        model.train()
        # Each batch's mean times its rows: a sum over rows, exact to divide (every row has seq_len tokens).
        loss = torch.stack(weighted).sum()
        if self.dist.world_size > 1:
            torch.distributed.all_reduce(loss)  # SUM
        return (loss / rows).item()
