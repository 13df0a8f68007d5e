"""Validation batches: the first N tokens of the val split as contiguous windows, the same every call."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .loader import _check_shape, _resolve
from .shards import check_token_ids, load_shard, read_header
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


def check_val_ids(files: list[Path], need: int, vocab_size: int) -> None:
    """ShardError naming the file, id and position when a shard holding the first `need` tokens of the
    val stream has an id >= vocab_size (the tokenizer's vocabulary, not the padded embedding, whose
    extra rows would score such an id silently). Called at start: validation only reads these
    shards after training steps, so a bad id found there would cost the run."""
    for f in files:
        if need <= 0:
            break
        check_token_ids(f, vocab_size)
        need -= read_header(f)


def _read_stream(files: list[Path], sizes: list[int], need: int) -> np.ndarray:
    """The first `need` tokens of the val shards."""
    stream = np.empty(need, dtype=np.uint32)  # holds uint16 and uint32 (32-bit shards) ids
    filled = 0
    for f, n in zip(files, sizes):
        if filled == need:
            break
        tokens = load_shard(f).numpy()
        take = min(n, need - filled)
        stream[filled : filled + take] = tokens[:take]
        filled += take
    return stream


def _to_device(chunk: np.ndarray, rows: int, seq_len: int, device: torch.device):
    inputs = torch.from_numpy(chunk[:-1].astype(np.int32).reshape(rows, seq_len))
    targets = torch.from_numpy(chunk[1:].astype(np.int64).reshape(rows, seq_len))
    if device.type != "cpu":
        inputs = inputs.pin_memory().to(device, non_blocking=True)
        targets = targets.pin_memory().to(device, non_blocking=True)
    return inputs, targets


def rank_val_batches(
    files: list[Path],
    *,
    seq_len: int,
    batch_size: int,
    rows: int,
    rank: int = 0,
    world_size: int = 1,
    device: str | torch.device = "cpu",
    only: set[int] | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """The first `rows` rows of seq_len tokens of the val stream, dealt to the ranks in contiguous blocks
    (sizes differing by at most one row), in batches of up to `batch_size` rows: (inputs, targets, real
    rows). Every rank yields the same number of batches, so a step with collectives (FSDP) never waits on
    a rank that ran out: a rank short of batches gets a one-row batch that scores nothing (0 real rows).
    The ranks together score exactly those rows whatever the world size, so a validation loss is the
    same figure on 1, 2 or 4 GPUs (up to the order of the float sums). `only`: the batches of these
    indices alone (every rank must pass the same set, for the same reason)."""
    _check_shape(batch_size, seq_len)
    start = rank_share(rows, world_size, rank)[0]
    device = torch.device(device)
    stream = _read_stream(files, [read_header(f) for f in files], rows * seq_len + 1)
    row = start
    for i, n in enumerate(batch_rows(rows, world_size, batch_size, rank)):
        if only is None or i in only:
            if n > 0:
                yield (*_to_device(stream[row * seq_len:(row + n) * seq_len + 1], n, seq_len, device), n)
            else:
                yield (*_to_device(stream[:seq_len + 1], 1, seq_len, device), 0)
        row += n


def rank_share(rows: int, world_size: int, rank: int) -> tuple[int, int, int]:
    """(first row, rows, the most rows any rank gets) of `rank`'s contiguous block of the validation rows."""
    per_rank, extra = divmod(rows, world_size)
    return rank * per_rank + min(rank, extra), per_rank + (rank < extra), per_rank + (extra > 0)


def batch_rows(rows: int, world_size: int, batch_size: int, rank: int) -> list[int]:
    """The real rows of each of `rank`'s validation batches as rank_val_batches deals them (0: its one-row batch
    that scores nothing); every rank has as many batches."""
    _, mine, most = rank_share(rows, world_size, rank)
    return [max(0, min(batch_size, mine - i * batch_size)) for i in range(-(-most // batch_size))]


def batches_of_each_shape(rows: int, world_size: int, batch_size: int) -> set[int]:
    """The fewest batch indices, the same on every rank, that give each rank every batch shape it meets in a whole
    validation: a compile warmup that runs these compiles all of validation's graphs (a batch's rows are its only
    shape that varies: a short last batch, a rank's empty one-row batch) without scoring every row."""
    chosen: set[int] = set()
    for rank in range(world_size):
        shapes = [max(n, 1) for n in batch_rows(rows, world_size, batch_size, rank)]
        met = {shapes[i] for i in chosen}
        for i, shape in enumerate(shapes):
            if shape not in met:
                chosen.add(i)
                met.add(shape)
    return chosen


def _val_iter(files, sizes, seq_len, batch_size, max_tokens, rank, world_size, device):
    stream = _read_stream(files, sizes, max_tokens + 1)
    local = batch_size * seq_len
    for step in range(max_tokens // (world_size * local)):
        start = step * world_size * local + rank * local
        yield _to_device(stream[start : start + local + 1], batch_size, seq_len, device)
