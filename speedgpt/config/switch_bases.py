"""Switches that would silently do nothing without their base: each is a one-line ConfigError naming
the key to set.

A switch that does nothing in a config that lacks its base (gates on value embeddings the model does
not have, YaRN with a window that never grows, ...) would let an A/B run or a sweep compare two
identical models without a word: the command must fail instead. Called by plan.validate after the
stage table is known to be consistent (the window and MTP checks read it, handed in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import ConfigError
from .model import ModelConfig
from .sections import Config

if TYPE_CHECKING:
    from ..stages import StagePlan


def check_switch_bases(cfg: Config, plan: StagePlan, windows_at: Callable[[int], tuple[int, int]]) -> None:
    """Raise ConfigError for the first switch that is on but would do nothing in this config, whose
    stage table is `plan` and whose attention windows at step s are `windows_at(s)`."""
    _check_model_switches(cfg.model)
    _check_yarn_growth(cfg, plan, windows_at)
    _check_adam_every(cfg)
    _check_stage_rows(cfg, plan)


def attention_layers(m: ModelConfig) -> list[int]:
    """The blocks that have attention (not in model.attn_free_layers)."""
    return [i for i in range(m.depth) if i not in m.attn_free_layers]


def window_keys(m: ModelConfig) -> set[str]:
    """The window letters (L, S) of the blocks that have attention."""
    return {m.window_key(i) for i in attention_layers(m)}


def _check_model_switches(m: ModelConfig) -> None:
    attn = attention_layers(m)
    unused = [i for i in m.value_embed_layers if i not in attn]
    if unused:
        raise ConfigError(f"model.value_embed_layers={m.value_embed_layers} lists attention-free layers {unused}, "
                          f"whose value embeddings would go unused; drop them from model.value_embed_layers")
    if m.value_embed_gates and not any(m.value_embed_slot(i) is not None for i in attn):
        raise ConfigError("model.value_embed_gates=true does nothing without value embeddings on an attention layer; "
                          "set model.value_embeds (e.g. --model.value_embeds=1) or model.value_embed_layers")
    if m.skip_gates and not (m.unet_skips and m.depth >= 2):
        raise ConfigError("model.skip_gates=true does nothing without U-net skip connections; set "
                          "--model.unet_skips=true (and model.depth >= 2)")
    if m.backout_layer == m.depth - 1:
        # x - lambda x is undone by the final norm (it is scale-free), so the backout would change nothing
        raise ConfigError(f"model.backout_layer={m.backout_layer} is the last block, whose output the final norm "
                          f"rescales anyway; set model.backout_layer to a block 0..{m.depth - 2} (record #40: 8 of 12)")
    if m.key_offset and "L" not in window_keys(m):
        raise ConfigError("model.key_offset=true acts in long-window attention layers only and this model has none; "
                          "add L to model.window_pattern (e.g. --model.window_pattern=SSSL)")
    for key, on in (("mimetic_vo_beta", m.mimetic_vo_beta > 0), ("yarn", m.yarn)):
        if on and not attn:
            raise ConfigError(f"model.{key}={getattr(m, key)!r} does nothing without attention layers; remove "
                              f"layers from model.attn_free_layers")


def _check_yarn_growth(cfg: Config, plan: StagePlan, windows_at: Callable[[int], tuple[int, int]]) -> None:
    """YaRN rescales rotary at each growth of the long window: a window that never changes gives it nothing to do."""
    if not cfg.model.yarn:
        return
    # Within a stage the long window is constant (its window_long) or the schedule's, which never
    # shrinks, so the windows at each stage's first and last step show every change there is.
    steps = {s for stage in plan.stages for s in (stage.start, stage.end - 1)} | {cfg.train.steps}
    if len({windows_at(s)[0] for s in steps}) == 1:
        raise ConfigError("model.yarn=true does nothing: the long attention window never grows in this run; set "
                          "schedule.window_end above schedule.window_start (or --schedule.window_rule=record28), "
                          "or stages with growing window_long")


def _check_adam_every(cfg: Config) -> None:
    o, t = cfg.optim, cfg.train
    if (t.tokens_per_param or t.flops_budget) and t.horizon != "steps":  # budget.py sets train.steps later
        return
    if o.adam_every > t.steps:
        raise ConfigError(f"optim.adam_every={o.adam_every} exceeds train.steps={t.steps}: Adam would never step; "
                          f"set optim.adam_every <= {t.steps} (record #39: 2)")


def _check_stage_rows(cfg: Config, plan: StagePlan) -> None:
    short_layers = "S" in window_keys(cfg.model)
    for stage in plan.stages if plan.from_table else ():
        i, s = stage.index, stage.row
        if s.window_short and not short_layers:
            raise ConfigError(f"train.stages[{i}].window_short={s.window_short} does nothing: no attention layer has a "
                              f"short window; leave it at 0 or add S to model.window_pattern")
        # the plan's weights have the row's defaults filled in (empty: [1.0]; no end: the start's)
        if stage.predicts > 1 and stage.mtp_weights[-1] == 0 and stage.mtp_weights_end[-1] == 0:
            raise ConfigError(f"train.stages[{i}]: the last MTP weight is 0 at both ends ({s.mtp_weights} -> "
                              f"{s.mtp_weights_end}), so that token ahead is scored for nothing; drop it from "
                              f"mtp_weights and mtp_weights_end")
