"""SpeedGPT's configuration for Hugging Face transformers.

`speedgpt export --format hf` copies this file, unchanged, next to the weights (with
modeling_speedgpt.py); it needs transformers only, never speedgpt. Every value is resolved by
speedgpt at export time from the run's config and the checkpoint's step: the per-layer choices
(window, attention-free, paired heads, key offset, value-embedding slot) are listed layer by layer,
and the rotary frequencies are stored as numbers (YaRN-rescaled when the run used YaRN), so the
modeling file derives nothing from training schedules.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class SpeedGPTConfig(PretrainedConfig):
    model_type = "speedgpt"

    def __init__(
        self,
        vocab_size: int = 50304,  # the padded vocabulary: the width of the logits
        token_vocab_size: int = 50257,  # the tokenizer's ids (below vocab_size)
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 6,
        num_key_value_heads: int | None = None,
        head_dim: int = 128,
        intermediate_size: int = 3072,  # the dense MLP's width
        max_position_embeddings: int = 1024,  # the context speedgpt trained (rotary positions beyond it are refused)
        rope_base: float = 1024.0,
        rope_half_truncate: bool = True,  # only the first half of the pairs rotate (the rest are stationary)
        # The angular frequency of each rotated pair of dims (head_dim / 2 numbers); an export stores the
        # ones the checkpoint's step uses (YaRN-rescaled), None: computed from rope_base as speedgpt does.
        rope_frequencies: list[float] | None = None,
        query_scale: float | None = None,  # YaRN's attention-scale multiplier on the rotated queries; None: none
        attention_scale: float | None = None,  # the softmax scale; None: head_dim ** -0.5
        attention_windows: tuple[int, int] = (1024, 1024),  # (long, short) in tokens
        window_block: int = 128,  # windows are whole blocks of this many positions
        layer_windows: str | None = None,  # per layer: L (long window) or S (short)
        attention_free_layers: list[int] | None = None,
        paired_head_layers: list[int] | None = None,
        key_offset_layers: list[int] | None = None,
        value_embed_slots: list[int | None] | None = None,  # per layer: which value embedding it adds (None: none)
        num_value_embeds: int = 0,
        value_embed_gates: bool = False,
        attn_gate: bool = False,
        gate_dim: int = 12,  # input channels of every sigmoid gate (attention, smear, skip, value embedding)
        unet_skips: bool = True,
        skip_gates: bool = False,
        x0_mixing: bool = True,
        smear: bool = False,
        bigram_rows: int = 0,  # rows of the bigram hash table; 0: none
        backout_layer: int = -1,
        logit_softcap: float = 15.0,
        logit_rescale: bool = False,
        doc_masking: bool = True,  # attend only within a document; a document starts at each BOS token
        moe_experts: int = 0,
        moe_top_k: int = 2,
        moe_shared_experts: int = 1,
        moe_dense_layers: int = 1,
        moe_hidden: int = 0,  # each expert's hidden width
        bos_token_id: int = 50256,
        eos_token_id: int = 50256,
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        speedgpt: dict | None = None,  # the run's full speedgpt config and the export's provenance
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.token_vocab_size = token_vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.rope_base = rope_base
        self.rope_half_truncate = rope_half_truncate
        self.rope_frequencies = list(rope_frequencies) if rope_frequencies is not None else None
        self.query_scale = query_scale
        self.attention_scale = attention_scale
        self.attention_windows = list(attention_windows)
        self.window_block = window_block
        self.layer_windows = layer_windows or "L" * num_hidden_layers
        self.attention_free_layers = list(attention_free_layers or [])
        self.paired_head_layers = list(paired_head_layers or [])
        self.key_offset_layers = list(key_offset_layers or [])
        self.value_embed_slots = (list(value_embed_slots) if value_embed_slots is not None
                                  else [None] * num_hidden_layers)
        self.num_value_embeds = num_value_embeds
        self.value_embed_gates = value_embed_gates
        self.attn_gate = attn_gate
        self.gate_dim = gate_dim
        self.unet_skips = unet_skips
        self.skip_gates = skip_gates
        self.x0_mixing = x0_mixing
        self.smear = smear
        self.bigram_rows = bigram_rows
        self.backout_layer = backout_layer
        self.logit_softcap = logit_softcap
        self.logit_rescale = logit_rescale
        self.doc_masking = doc_masking
        self.moe_experts = moe_experts
        self.moe_top_k = moe_top_k
        self.moe_shared_experts = moe_shared_experts
        self.moe_dense_layers = moe_dense_layers
        self.moe_hidden = moe_hidden
        self.use_cache = use_cache
        self.speedgpt = speedgpt
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)
