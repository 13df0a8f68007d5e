"""The model section: shape, attention, numerics, Mixture-of-Experts and the later speedrun records'
switches (their checks: config/model_checks.py and, where a switch needs a base, config/switch_bases.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    # Depth knob: when model_dim is 0 the width is derived as depth * aspect_ratio rounded up to a
    # multiple of head_dim, and the head count follows from the width (nanochat's recipe).
    depth: int = 12
    model_dim: int = 768
    head_dim: int = 128
    num_heads: int = 0  # 0: model_dim // head_dim
    num_kv_heads: int = 0  # grouped-query attention: key/value heads, each shared by num_heads / num_kv_heads queries; 0: num_heads
    aspect_ratio: int = 64
    mlp_ratio: float = 4.0
    vocab_size: int = 50257
    vocab_pad_multiple: int = 128  # 50257 -> 50304: tensor-core friendly head matmul
    # The document separator that starts every document (BOS): doc masking and sampling's stop token.
    # Like vocab_size, `speedgpt train` takes it from the shards' tokenizer (GPT-2's <|endoftext|> here).
    bos_id: int = 50256
    rope_base: float = 1024.0
    rope_half_truncate: bool = True  # rotate only half the head dims; the rest carry position-free content
    value_embeds: int = 3  # value embeddings shared U-shaped: first k and last k layers; 0 disables
    unet_skips: bool = True
    x0_mixing: bool = True
    attn_free_layers: list[int] = field(default_factory=list)
    window_pattern: str = "L"  # per-layer Long/Short sliding window, repeated to depth
    attn_scale: float = 0.0  # 0: 1/sqrt(head_dim)
    attn_gate: bool = False  # sparse per-head sigmoid gate on attention output (record #28)
    attn_gate_dim: int = 12
    logit_softcap: float = 15.0  # 0 disables
    attn_backend: str = "auto"  # auto | sdpa | flex
    doc_masking: bool = True  # attend only within the document (documents start at BOS)
    fp8_head: bool = False  # lm_head in FP8 via torch._scaled_mm (Hopper+), bf16 fallback elsewhere
    # The FP8 head's static weight scale is fp8_head_w_bound / 448: |W| up to the bound is representable.
    # 24 is generous; record #28 uses w_s = 2^-9, i.e. a bound of 448 * 2^-9 = 0.875 (finer steps).
    fp8_head_w_bound: float = 24.0
    # The FP8 head only while training; evaluation and inference use the bf16 head (record #28's
    # CastedLinear takes the FP8 path only when self.training, so its val losses are bf16-head losses).
    fp8_head_train_only: bool = False
    # The unfused FP8 head's weight gradient as an FP8 matmul (e4m3 input x e5m2 gradient, fp32 out), as
    # record #28 computes it; off: a bf16 matmul (no transposed copy of the logit gradient; more precise)
    fp8_head_fp8_wgrad: bool = False
    bf16_embeds: bool = False
    # Softcapped cross-entropy in Triton (CUDA + triton only). With fp8_head, training runs head + loss
    # as one op whose kernel also writes the e5m2 logit gradient (model/fp8_head.py).
    fused_ce: bool = False
    # With fused_ce: multi-token prediction (train.stages.mtp_weights) and the logit rescale also take the
    # fused loss (with fp8_head the fused head + loss op) instead of unfused torch ops / an unfused FP8 head
    fused_mtp: bool = True
    # MLP matmuls (forward and input gradient) in FP8 with dynamic scales (model/fp8_linear.py; Hopper+,
    # bf16 elsewhere).
    fp8_mlp: bool = False
    fp8_attn: bool = False  # likewise for the attention's qkv and output projections
    # The scaling of both (fp8_mlp, fp8_attn): rowwise (one scale per token / output unit) | tensorwise
    # (one per tensor: a token's output then depends on the rest of the batch, so KV-cached decoding
    # no longer equals a full forward).
    fp8_scaling: str = "rowwise"
    # rowwise fp8_mlp: ReLU² with its FP8 casts as one Triton kernel each way (model/kernels/relu2_fp8.py)
    fp8_mlp_fused_act: bool = True
    # Later speedrun records' attention switches (model/attention.py, model/yarn.py; off until an A/B shows a gain):
    # partial key offset (record #49): in long-window layers, the keys' stationary rotary dims come from the
    # previous position (never across a document start), so one layer can do induction
    key_offset: bool = False
    # paired-head attention (record #58): in these layers heads h and h + H/2 attend as one sequence of 2T positions
    paired_head_layers: list[int] = field(default_factory=list)
    # YaRN (record #31): rescale rotary frequencies and the attention scale each time the long window grows
    yarn: bool = False

    # Mixture-of-Experts MLPs, DeepSeek-V3 style (model/moe.py): 0 experts keeps the dense MLP everywhere.
    moe_experts: int = 0  # routed experts per MoE layer
    moe_top_k: int = 2  # routed experts each token uses
    moe_shared_experts: int = 1  # experts every token uses; expert width = dense MLP width / (top_k + shared)
    moe_dense_layers: int = 1  # the first layers keep the dense MLP (DeepSeek-V3 keeps 3 of 61)
    # aux-loss-free balancing: the expert bias moves this much per optimizer step. DeepSeek-V3's 1e-3
    # needs ~1000 steps to move a bias across the (0, 1) range of the affinities; runs of a few hundred
    # steps stayed collapsed onto a few experts at it, and balanced within ~50 steps at 1e-2 (CPU,
    # docs/experiments.md, "moe-d12's divergence").
    moe_bias_rate: float = 1e-2

    # Later speedrun records' embedding-side switches (model/embeddings.py, model/gates.py); all off by
    # default, none proven here yet (docs/experiments.md). Record numbers as in shared/REFERENCE.md.
    bigram_vocab_mult: int = 0  # bigram hash embedding of (previous, current) token: rows = this x padded vocab (#62: 5); 0: off
    smear: bool = False  # smear gate: add a gated share of the previous token's embedding (#34)
    value_embed_gates: bool = False  # per-head sigmoid gates on the value embeddings (#55)
    skip_gates: bool = False  # sigmoid gates on the U-net skip connections, read from x0 (#55)
    backout_layer: int = -1  # backout: subtract a learned share of this block's output before the head (#40: 8); -1: off
    logit_rescale: bool = False  # logits 23 sigmoid((z + 5) / 7.5) instead of the symmetric softcap (#54)
    # Embedding tied to the lm_head (the lookup reads the head's rows) for this fraction of training, then
    # untied with the head's weights and Adam state copied (#53: 2/3; 1.0: tied throughout, #51); 0: untied.
    tie_embed_frac: float = 0.0
    value_embed_layers: list[int] = field(default_factory=list)  # one untied value embedding per listed layer (#63); empty: value_embeds' U-shape
    mimetic_vo_beta: float = 0.0  # mimetic V/O init: V = sqrt(b) I, O = -sqrt(b) I per head, plus noise (#64: 0.05); 0: off

    def resolved_dim(self) -> int:
        if self.model_dim:
            return self.model_dim
        return math.ceil(self.depth * self.aspect_ratio / self.head_dim) * self.head_dim

    def resolved_heads(self) -> int:
        return self.num_heads or self.resolved_dim() // self.head_dim

    def resolved_kv_heads(self) -> int:
        return self.num_kv_heads or self.resolved_heads()

    def window_key(self, layer: int) -> str:
        """The window letter of `layer` (L: long, S: short): window_pattern repeated to depth."""
        return (self.window_pattern * self.depth)[layer]

    def value_embed_slot(self, layer: int) -> int | None:
        """Which value embedding `layer` adds to its values (None: none): one per listed layer with
        value_embed_layers (untied), else value_embeds shared U-shaped by the first and last k layers."""
        if self.value_embed_layers:
            return self.value_embed_layers.index(layer) if layer in self.value_embed_layers else None
        k, depth = self.value_embeds, self.depth
        if layer < k:
            return layer
        if layer >= depth - k:
            return layer - (depth - k)
        return None

    def padded_vocab(self) -> int:
        m = self.vocab_pad_multiple
        return math.ceil(self.vocab_size / m) * m if m > 1 else self.vocab_size
