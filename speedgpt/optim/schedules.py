"""Schedules as pure functions of training progress: trivially testable and checkpointed.

Each returns a multiplier (or a value) for step `step` of `total` optimizer steps.
"""

from __future__ import annotations

import math

from ..config import ScheduleConfig


def constant_cooldown(step: int, total: int, cooldown_frac: float, final_frac: float, warmup_frac: float = 0.0) -> float:
    """Optional linear warmup, constant, then linear decay to `final_frac` over the last `cooldown_frac`."""
    x = step / total
    if warmup_frac and x < warmup_frac:
        return (step + 1) / (warmup_frac * total)
    if x < 1 - cooldown_frac:
        return 1.0
    w = (1 - x) / cooldown_frac
    return w + (1 - w) * final_frac


def warmup_cosine(step: int, total: int, warmup_frac: float, final_frac: float) -> float:
    warm = warmup_frac * total
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1.0, total - warm)
    return final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def lr_multiplier(cfg: ScheduleConfig, step: int, total: int) -> float:
    if cfg.kind == "warmup_cosine":
        return warmup_cosine(step, total, cfg.warmup_frac, cfg.final_lr_frac)
    # WSD (warmup-stable-decay) is constant_cooldown with a warmup; kept as its own name for clarity.
    return constant_cooldown(step, total, cfg.cooldown_frac, cfg.final_lr_frac, cfg.warmup_frac)


def muon_weight_decay(base: float, schedule: str, lr_mult: float, progress: float = 0.0) -> float:
    """Muon's decoupled weight decay for a step whose lr multiplier is `lr_mult`, at `progress` =
    step / total: `base` throughout ("constant"), `base * lr_mult` ("lr"), or `base * (1 - progress)`
    ("linear": zero at the end, nanochat's depth-ladder schedule). The decay applied is lr * this, so
    with "lr" it falls with the square of the schedule.

    The speedrun record that put (cautious) decay on a schedule (2025-11-10; kept since) uses
    effective_wd = scheduled_lr * weight_decay, wd = 1.2 at a peak lr of 0.03: 0.036 at the start.
    Here the multiplier replaces the absolute rate, so that coefficient is muon_weight_decay = 0.036
    with schedule "lr". Two differences remain: the decay per step also scales with muon_lr (0.05
    in these presets), and the record also multiplies its decay by the tall-matrix lr scale
    (muon_lr_scale), which this code, like before, does not."""
    if schedule == "lr":
        return base * lr_mult
    if schedule == "constant":
        return base
    if schedule == "linear":
        return base * (1.0 - progress)
    raise ValueError(f"unknown weight-decay schedule '{schedule}'; use constant, lr or linear")


def muon_momentum(step: int, start: float, end: float, warmup_steps: int) -> float:
    if warmup_steps <= 0:
        return end
    frac = min(step / warmup_steps, 1.0)
    return (1 - frac) * start + frac * end


def attention_windows(cfg: ScheduleConfig, step: int, total: int) -> tuple[int, int]:
    """(long, short) sliding windows in tokens: long grows linearly from window_start to window_end in
    multiples of window_block; short is a fixed fraction of long (at least one block).

    window_rule "linear": round(start + x (end - start)) blocks at progress x; "record28": the record's
    ceil rule (above). The record's short window is long // 2 blocks, 0 at step 0; its FlexAttention
    masks still keep the query's own (diagonal) block then, so one block here is the same mask."""
    x = step / total
    if cfg.window_rule == "record28":
        # Record #28's get_window_size_blocks: the smallest multiple of the block >= (end - block/2) * x,
        # at least one block (1728 * x tokens for 1792 / 128: ceil(13.5 x) blocks; window_start unused).
        blocks = max(1, math.ceil((cfg.window_end - cfg.window_block / 2) * x / cfg.window_block))
    else:
        blocks_start = cfg.window_start / cfg.window_block
        blocks_end = cfg.window_end / cfg.window_block
        blocks = max(1, round(blocks_start + x * (blocks_end - blocks_start)))
    long = blocks * cfg.window_block
    short = max(cfg.window_block, int(blocks * cfg.short_window_frac) * cfg.window_block)
    return long, min(short, long)
