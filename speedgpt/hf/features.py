"""Which of a model's switches a Hugging Face export carries, which it drops, and which it refuses.

Every field of ModelConfig is in exactly one of two tables (tests/test_hf_export.py checks that):
- ARCHITECTURE: part of the function the model computes; modeling_speedgpt.py implements each.
- TRAINING_ONLY: how training ran (kernels, FP8 scaling, initialization, load balancing); the
  exported model computes the same function without them, in the weights' dtype. A non-default
  value gets a note at export saying what is dropped.
A field in neither table (a switch added to speedgpt after this writer) is refused at export when
it is not at its default: the export would otherwise compute something else than the run did.
"""

from __future__ import annotations

import dataclasses

from ..config import Config, ModelConfig
from ..export import ExportError

ARCHITECTURE = frozenset({
    "depth", "model_dim", "head_dim", "num_heads", "num_kv_heads", "aspect_ratio", "mlp_ratio", "vocab_size",
    "vocab_pad_multiple", "rope_base", "rope_half_truncate", "value_embeds", "unet_skips", "x0_mixing",
    "attn_free_layers", "window_pattern", "attn_scale", "attn_gate", "attn_gate_dim", "logit_softcap",
    "doc_masking", "key_offset", "paired_head_layers", "yarn", "moe_experts", "moe_top_k", "moe_shared_experts",
    "moe_dense_layers", "bigram_vocab_mult", "smear", "value_embed_gates", "skip_gates", "backout_layer",
    "logit_rescale", "tie_embed_frac", "value_embed_layers", "bos_id",
})

TRAINING_ONLY = {
    "attn_backend": "the attention backend (flex and sdpa compute the same masks; the export uses sdpa)",
    "fp8_head": "the FP8 lm_head: the head runs in the weights' dtype (speedgpt quantizes it on FP8 GPUs)",
    "fp8_head_w_bound": "the FP8 head's weight scale",
    "fp8_head_train_only": "when the FP8 head runs",
    "fp8_head_fp8_wgrad": "the FP8 head's weight gradient",
    "bf16_embeds": "the embeddings' training dtype (the export stores them in --dtype)",
    "fused_ce": "the fused softcap cross-entropy kernel",
    "fused_mtp": "the fused multi-token-prediction loss kernel (a training loss only)",
    "fp8_mlp": "FP8 MLP matmuls: they run in the weights' dtype",
    "fp8_attn": "FP8 attention projections: they run in the weights' dtype",
    "fp8_scaling": "the FP8 matmuls' scaling",
    "fp8_mlp_fused_act": "the fused ReLU^2 + FP8 cast kernel",
    "moe_bias_rate": "the experts' load balancing (the bias it reached is exported)",
    "mimetic_vo_beta": "the mimetic V/O initialization",
}


class UnsupportedFeature(ExportError):
    """The run uses a switch the Hugging Face export does not implement; the message names it."""


def check_supported(cfg: Config) -> list[str]:
    """Refuse a model whose switches the export does not implement (UnsupportedFeature); return the
    notes on what is dropped: training-only switches that are on, and multi-token prediction."""
    from ..stages import stage_plan

    default = ModelConfig()
    notes = []
    for f in dataclasses.fields(ModelConfig):
        value = getattr(cfg.model, f.name)
        if f.name in ARCHITECTURE or value == getattr(default, f.name):
            continue
        if f.name not in TRAINING_ONLY:
            raise UnsupportedFeature(f"model.{f.name}={value!r} is not supported by --format hf (modeling_speedgpt.py "
                                     f"does not implement it); export with --format speedgpt instead")
        notes.append(f"dropped model.{f.name}={value!r}: {TRAINING_ONLY[f.name]}")
    if stage_plan(cfg).has_mtp:
        notes.append("dropped multi-token prediction: a training loss only (it has no weights)")
    return notes
