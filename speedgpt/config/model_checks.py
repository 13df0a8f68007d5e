"""Validation of the model section: shapes, attention layout, numerics and the later records' switches."""

from __future__ import annotations

import math

from .errors import ConfigError
from .model import ModelConfig


def check_model(m: ModelConfig) -> None:
    _check_model_numbers(m)
    dim = m.resolved_dim()
    if m.depth < 1:
        raise ConfigError(f"model.depth={m.depth} must be at least 1")
    if dim % m.resolved_heads():
        raise ConfigError(f"model.num_heads={m.resolved_heads()} does not divide model.model_dim={dim}; "
                          f"choose heads that divide the width")
    if m.num_heads and m.num_heads * m.head_dim != dim:
        raise ConfigError(f"model.num_heads={m.num_heads} x model.head_dim={m.head_dim} != model.model_dim={dim}; "
                          f"set model.head_dim={dim // m.num_heads}")
    if m.num_kv_heads < 0 or m.resolved_heads() % m.resolved_kv_heads():
        raise ConfigError(f"model.num_kv_heads={m.num_kv_heads} must divide the {m.resolved_heads()} query heads "
                          f"(0: as many as query heads)")
    if m.moe_experts < 0 or (m.moe_experts and not 1 <= m.moe_top_k <= m.moe_experts):
        raise ConfigError(f"model.moe_top_k={m.moe_top_k} must lie in 1..model.moe_experts={m.moe_experts}")
    if m.moe_experts and (m.moe_shared_experts < 0 or not 0 <= m.moe_dense_layers < m.depth):
        raise ConfigError(f"model.moe_dense_layers={m.moe_dense_layers} must leave at least one of the {m.depth} "
                          f"layers for experts, and model.moe_shared_experts={m.moe_shared_experts} must be >= 0")
    if m.moe_experts and m.moe_bias_rate < 0:  # a negative rate would push the loads apart
        raise ConfigError(f"model.moe_bias_rate={m.moe_bias_rate} must be >= 0 (0 turns the balancing off)")
    if m.head_dim % 4:
        raise ConfigError(f"model.head_dim={m.head_dim} must be a multiple of 4 for rotary embeddings")
    if not m.value_embed_layers and m.value_embeds * 2 > m.depth:
        raise ConfigError(f"model.value_embeds={m.value_embeds} needs depth >= {2 * m.value_embeds} "
                          f"(they are used by the first and last layers); lower it or raise model.depth")
    if m.attn_backend not in ("auto", "sdpa", "flex"):
        raise ConfigError(f"model.attn_backend='{m.attn_backend}' must be one of auto, sdpa, flex")
    if m.fp8_scaling not in ("rowwise", "tensorwise"):
        raise ConfigError(f"model.fp8_scaling='{m.fp8_scaling}' must be rowwise or tensorwise")
    if set(m.window_pattern) - {"L", "S"} or not m.window_pattern:
        raise ConfigError(f"model.window_pattern='{m.window_pattern}' must be letters L (long) and S (short)")
    bad = [i for i in m.attn_free_layers if not 0 <= i < m.depth]
    if bad:
        raise ConfigError(f"model.attn_free_layers={m.attn_free_layers} has layers outside 0..{m.depth - 1}")
    if m.attn_gate and m.attn_gate_dim > dim:
        raise ConfigError(f"model.attn_gate_dim={m.attn_gate_dim} exceeds model_dim={dim}")
    bad = [i for i in m.paired_head_layers if not 0 <= i < m.depth or i in m.attn_free_layers]
    if bad:
        raise ConfigError(f"model.paired_head_layers={m.paired_head_layers}: layers {bad} are outside 0..{m.depth - 1} "
                          f"or attention-free")
    if m.paired_head_layers and (m.resolved_heads() % 2 or m.resolved_kv_heads() != m.resolved_heads()):
        raise ConfigError(f"model.paired_head_layers needs an even number of heads (have {m.resolved_heads()}) and "
                          f"model.num_kv_heads=0 (no grouped-query attention)")
    if m.key_offset and not m.rope_half_truncate:
        raise ConfigError("model.key_offset shifts the stationary rotary dims, which only half-truncated rotary has; "
                          "set model.rope_half_truncate=true")
    if m.fp8_head_w_bound <= 0:
        raise ConfigError(f"model.fp8_head_w_bound={m.fp8_head_w_bound} must be > 0 (record #28: 0.875)")
    _check_later_records(m)


def _check_model_numbers(m: ModelConfig) -> None:
    """The float keys the model's shapes and math take as they are: a bad one failed deep in the model's build
    (mlp_ratio 0: a reshape error; rope_base 0: a division by zero) or at step 1 as a non-finite loss whose
    message blames the learning rates."""
    for key, value, floor, what in (("mlp_ratio", m.mlp_ratio, "> 0", "hidden width over model width; 4.0"),
                                    ("rope_base", m.rope_base, "> 0", "rotary's base period; record #28: 1024"),
                                    ("attn_scale", m.attn_scale, ">= 0", "0: 1/sqrt(head_dim)"),
                                    ("logit_softcap", m.logit_softcap, ">= 0", "0: no cap; record #28: 15")):
        if not math.isfinite(value) or (value <= 0 if floor == "> 0" else value < 0):
            raise ConfigError(f"model.{key}={value} must be finite and {floor} ({what})")


def _check_later_records(m: ModelConfig) -> None:
    """The later records' switches (bigram hash, gates, backout, tying, untied value embeddings)."""
    dim = m.resolved_dim()
    if m.bigram_vocab_mult < 0:
        raise ConfigError(f"model.bigram_vocab_mult={m.bigram_vocab_mult} must be >= 0 (record #62: 5; 0: off)")
    if not -1 <= m.backout_layer < m.depth:
        raise ConfigError(f"model.backout_layer={m.backout_layer} must be a block index 0..{m.depth - 1} "
                          f"(record #40: 8 of 12), or -1 (off)")
    if not 0.0 <= m.tie_embed_frac <= 1.0:
        raise ConfigError(f"model.tie_embed_frac={m.tie_embed_frac} must lie in [0, 1] (record #53: 0.667; 0: untied)")
    layers = m.value_embed_layers
    if layers and (len(set(layers)) != len(layers) or not all(0 <= i < m.depth for i in layers)):
        raise ConfigError(f"model.value_embed_layers={layers} must list distinct layers in 0..{m.depth - 1}")
    if (m.smear or m.value_embed_gates or m.skip_gates) and m.attn_gate_dim > dim:
        raise ConfigError(f"model.attn_gate_dim={m.attn_gate_dim} (the gates' input channels) exceeds model_dim={dim}")
    if m.mimetic_vo_beta < 0 or (m.mimetic_vo_beta and (m.resolved_kv_heads() != m.resolved_heads()
                                                        or m.resolved_heads() * m.head_dim != dim)):
        raise ConfigError(f"model.mimetic_vo_beta={m.mimetic_vo_beta} must be >= 0, and > 0 needs square per-head "
                          f"V and O blocks: num_heads x head_dim == model_dim and no grouped-query attention")
