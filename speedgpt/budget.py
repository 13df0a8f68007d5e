"""A compute budget -> the concrete run: steps, batch size and width-scaled hyperparameters.

Users who want the best model a budget buys at a chosen depth name the budget, not the step
count (the recipe of nanochat's depth ladder; the rules below are documented in docs/scaling.md):

* Horizon. ``train.tokens_per_param`` (D = ratio x scaling parameters) or ``train.flops_budget``
  (D = FLOPs / training FLOPs per token) gives the training tokens D; steps = D / batch. With
  ``train.horizon = "steps"`` (what ``--train.steps=N`` over a budget writes, config/overrides.py)
  ``train.steps`` is the horizon instead and D only derives the batch.
  Scaling parameters are the transformer's matrices plus the lm_head: the count whose loss
  curves line up best across depths (embeddings and scalars excluded).
* Batch. ``train.batch_tokens = 0`` derives the batch from D, not from the parameters:
  B_opt is proportional to D^0.383 ("Power Lines", arXiv:2505.13738), anchored at 2^19 tokens
  for the d12 model of this architecture trained at ANCHOR_TOKENS_PER_PARAM, and rounded to the
  nearest power of two.
* Width. ``optim.tuned_width`` names the width the learning rates and Muon weight decay were
  tuned at; Adam lrs scale as (tuned / width)^0.5 and Muon weight decay as (tuned / width)^2.

``resolve_budget`` runs once, before training: it writes the resolved values into the config
(so the run's config.toml reproduces the run without deriving anything again) and returns the
lines the trainer prints at start. With none of these keys set it returns the config unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

from .config import Config, ConfigError, ModelConfig
from .config.overrides import BUDGET_KEYS

ANCHOR_DEPTH = 12
ANCHOR_BATCH_TOKENS = 2**19
# nanochat measured 2^19 as the best batch of its d12 at its default horizon of 12 tokens per
# scaling parameter (--target-param-data-ratio); the anchor is that compute-optimal d12 run.
ANCHOR_TOKENS_PER_PARAM = 12.0
BATCH_EXPONENT = 0.383
# Whole steps move a budget by up to half a step; past this share it is said at start.
ROUNDING_WARN = 0.05


def meta_model(model_cfg: ModelConfig, seq_len: int):
    """The model on the meta device: shapes and counts without allocating memory."""
    import torch

    from .model.gpt import GPT

    with torch.device("meta"):
        return GPT(model_cfg, seq_len)


def scaling_params_of(model) -> int:
    """Transformer matrices (every >= 2-D parameter of the blocks) plus the lm_head."""
    return sum(p.numel() for p in model.param_groups()["matrix"]) + model.lm_head.weight.numel()


def scaling_params(model_cfg: ModelConfig) -> int:
    return scaling_params_of(meta_model(model_cfg, 8))


def ladder_model(model_cfg: ModelConfig, depth: int) -> ModelConfig:
    """This architecture at another depth of the depth knob (width = depth x aspect_ratio)."""
    return dataclasses.replace(model_cfg, depth=depth, model_dim=0, num_heads=0,
                               attn_free_layers=[i for i in model_cfg.attn_free_layers if i < depth],
                               value_embeds=min(model_cfg.value_embeds, depth // 2))


def optimal_batch_tokens(tokens: float, model_cfg: ModelConfig) -> int:
    """The power-of-two batch for a horizon of `tokens`: 2^19 x (tokens / D_anchor)^0.383, where
    D_anchor is the compute-optimal horizon of this architecture's d12."""
    return _batch_at(tokens, _anchor_tokens(model_cfg))


def _anchor_tokens(model_cfg: ModelConfig) -> float:
    return ANCHOR_TOKENS_PER_PARAM * scaling_params(ladder_model(model_cfg, ANCHOR_DEPTH))


def _batch_at(tokens: float, anchor_tokens: float) -> int:
    return 2 ** round(math.log2(ANCHOR_BATCH_TOKENS * (tokens / anchor_tokens) ** BATCH_EXPONENT))


def smallest_horizon(cfg: Config) -> int:
    """The fewest training tokens that make one whole step: the batch when it is given; with a derived
    batch, the smallest power of two D whose batch fits in it (the batch grows with D, slower than D,
    and is a power of two, so no D between powers of two fits before that one)."""
    if cfg.train.batch_tokens:
        return cfg.train.batch_tokens
    anchor = _anchor_tokens(cfg.model)
    return next(2**j for j in range(64) if _batch_at(2**j, anchor) <= 2**j)


class BudgetBelowOneStep(ConfigError):
    """A horizon (train.tokens_per_param or train.flops_budget) of less than one training step. `key` and
    `smallest` (the least value of that key that trains one step at this depth) let a caller name its own
    flag (`speedgpt sweep --flops`)."""

    def __init__(self, message: str, key: str, smallest: float):
        super().__init__(message)
        self.key, self.smallest = key, smallest


def _up(x: float, digits: int = 3) -> float:
    """`x` rounded up to `digits` significant digits: a smallest budget printed that way, and given back,
    is never refused for the digits that printing dropped."""
    scale = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / scale - 1e-9) * scale


def training_flops_per_token(cfg: Config) -> float:
    """Training FLOPs per token at the schedule's final attention window (model.flops_per_token)."""
    from .optim.schedules import attention_windows

    model = meta_model(cfg.model, cfg.data.seq_len)
    return model.flops_per_token(cfg.data.seq_len, windows=attention_windows(cfg.schedule, 1, 1))


@dataclass
class Budget:
    scaling_params: int
    tokens: int  # tokens trained: steps x batch
    batch_tokens: int
    steps: int
    flops: float  # training FLOPs: tokens x FLOPs per token


def describe(cfg: Config) -> Budget:
    """The budget of an already resolved config (no derivation): for reports and sweeps."""
    tokens = cfg.train.steps * cfg.train.batch_tokens
    return Budget(scaling_params(cfg.model), tokens, cfg.train.batch_tokens, cfg.train.steps,
                  tokens * training_flops_per_token(cfg))


def needs_resolution(cfg: Config) -> bool:
    t = cfg.train
    return bool(t.tokens_per_param or t.flops_budget or t.batch_tokens == 0 or cfg.optim.tuned_width)


def resolve_budget(cfg: Config) -> tuple[Config, list[str]]:
    """(resolved copy of cfg, lines saying what was derived). The one place budgets become numbers."""
    t, o = cfg.train, cfg.optim
    for key in BUDGET_KEYS:
        if not math.isfinite(getattr(t, key)) or getattr(t, key) < 0:  # inf was an OverflowError's traceback
            raise ConfigError(f"train.{key}={getattr(t, key)} must be finite and >= 0 (0 turns it off)")
    if t.horizon not in ("auto", "steps"):
        raise ConfigError(f"train.horizon='{t.horizon}' must be auto (a budget when one is set, else train.steps) "
                          f"or steps")
    if t.tokens_per_param and t.flops_budget:
        raise ConfigError("train.tokens_per_param and train.flops_budget both set the horizon; set one of them to 0")
    if t.batch_tokens < 0:
        raise ConfigError(f"train.batch_tokens={t.batch_tokens} must be > 0, or 0 to derive it from the horizon")
    if t.batch_tokens == 0 and not (t.tokens_per_param or t.flops_budget):
        raise ConfigError("train.batch_tokens=0 derives the batch from the training tokens; set "
                          "train.tokens_per_param (e.g. 12) or train.flops_budget, or give the batch in tokens")
    if o.tuned_width < 0:
        raise ConfigError(f"optim.tuned_width={o.tuned_width} must be >= 0 (0 turns width scaling off)")
    if o.tuned_width and o.scale_lr_by_width:
        raise ConfigError("optim.tuned_width and optim.scale_lr_by_width both scale the Adam lrs by width; "
                          "use --optim.scale_lr_by_width=false")
    if not needs_resolution(cfg):
        return cfg, []
    cfg = copy.deepcopy(cfg)
    t, o = cfg.train, cfg.optim
    lines = []
    n_params = scaling_params(cfg.model)
    if t.tokens_per_param or t.flops_budget:
        if t.tokens_per_param:
            key, value, per_token = "tokens_per_param", t.tokens_per_param, 1 / n_params  # the key's unit per token
            tokens = t.tokens_per_param * n_params
            source = f"{t.tokens_per_param:g} tokens/param x {n_params:,} scaling params"
        else:
            key, value, per_token = "flops_budget", t.flops_budget, training_flops_per_token(cfg)
            tokens = t.flops_budget / per_token
            source = f"{t.flops_budget:.3g} FLOPs / {per_token:,.0f} FLOPs/token"
        by_steps = t.horizon == "steps"  # the budget derives the batch only (overrides.py: --train.steps=N)
        least = 0 if by_steps else smallest_horizon(cfg)
        if tokens < least * (1 - 1e-9):  # the float product of a budget given back from this message
            smallest = _up(least * per_token)
            raise BudgetBelowOneStep(
                f"train.{key}={value:g} is {tokens:,.4g} training tokens at depth {cfg.model.depth}, less than one "
                f"step ({least:,} tokens); the smallest train.{key} for this depth is {smallest:.3g} (one step)",
                key, smallest)
        derived = t.batch_tokens == 0
        if derived:
            t.batch_tokens = optimal_batch_tokens(tokens, cfg.model)
            if t.batch_tokens % cfg.data.seq_len:
                raise ConfigError(f"the derived batch of {t.batch_tokens:,} tokens is not a whole number of rows of "
                                  f"data.seq_len={cfg.data.seq_len}; use a power-of-two seq_len or set "
                                  f"train.batch_tokens yourself")
            lines.append(f"budget: batch {t.batch_tokens:,} tokens (2^{int(math.log2(t.batch_tokens))}, derived "
                         f"from {tokens:,.0f} tokens as B ~ D^{BATCH_EXPONENT} anchored at d{ANCHOR_DEPTH} = "
                         f"2^{int(math.log2(ANCHOR_BATCH_TOKENS))})")
        budget_steps = max(1, round(tokens / t.batch_tokens))
        if by_steps:
            role = "derives the batch only" if derived else "is not used, the batch being given"
            lines.append(f"budget: train.steps={t.steps:,} sets the horizon (train.horizon=steps): {t.steps:,} steps x "
                         f"{t.batch_tokens:,} tokens = {t.steps * t.batch_tokens:,} tokens "
                         f"({t.steps * t.batch_tokens / n_params:.2f} tokens/param); train.{key}={value:g} {role} "
                         f"(as the horizon it would train {budget_steps:,} steps)")
        else:
            t.steps = budget_steps
            lines.append(f"budget: train.{key}={value:g} sets the horizon: {t.steps:,} steps x {t.batch_tokens:,} "
                         f"tokens = {t.steps * t.batch_tokens:,} tokens ({source}; "
                         f"{t.steps * t.batch_tokens / n_params:.2f} tokens/param)")
        change = t.steps * t.batch_tokens / tokens - 1
        if not by_steps and abs(change) > ROUNDING_WARN:
            lines.append(f"warning: whole steps change the budget by {change:+.0%}: train.{key}={value:g} asks for "
                         f"{tokens:,.0f} tokens, {t.steps:,} steps of {t.batch_tokens:,} train "
                         f"{t.steps * t.batch_tokens:,}")
    if o.tuned_width:
        width = cfg.model.resolved_dim()
        lr_scale, wd_scale = (o.tuned_width / width) ** 0.5, (o.tuned_width / width) ** 2
        for key in ("embed_lr", "value_embed_lr", "head_lr", "scalar_lr", "router_lr"):
            setattr(o, key, getattr(o, key) * lr_scale)
        o.muon_weight_decay *= wd_scale
        lines.append(f"budget: width {width} vs tuned width {o.tuned_width}: Adam lrs x {lr_scale:.4f}, "
                     f"Muon weight decay x {wd_scale:.4f} = {o.muon_weight_decay:.6g}")
        o.tuned_width = 0  # the scaled values are now the config's: resolving again changes nothing
    return cfg, lines
