"""SpeedGPT for Hugging Face transformers: `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`.

`speedgpt export --format hf` copies this file, unchanged, next to the weights. It needs torch and
transformers only, never speedgpt, and re-implements speedgpt's forward for inference (fp32 or
bf16, plain PyTorch, scaled_dot_product_attention with explicit boolean masks). It is a twin of
speedgpt/model/*.py on purpose: speedgpt's tests hold the two to the same logits (1e-5 in fp32),
with and without the KV cache, for every preset's architecture.

The architecture: a normed token embedding, RMSNorm without weights, QK-norm, rotary embeddings
(half-truncated, optionally YaRN-rescaled), ReLU^2 MLPs or Mixture-of-Experts layers, value
embeddings mixed into the values, U-net skips, x0 mixing, long/short sliding windows counted in
whole blocks, grouped-query attention, and the later speedrun records' switches (attention gate,
smear gate, bigram hash embedding, value-embedding and skip gates, paired-head attention, partial
key offset, backout, softcap or asymmetric logit rescale).

Positions and documents, as in training:
- a BOS token (<|endoftext|>) inside the input starts a new document: with `doc_masking` (the
  default), tokens after it do not attend to tokens before it, with or without the KV cache;
- positions count from each row's first real token (a 2-D `attention_mask` with left padding is
  honoured: padded positions are never attended to and do not count as positions); the first real
  token has no previous token (smear gate, bigram hash and key offset look one token back).
`position_ids` and `inputs_embeds` are not accepted: positions come from the attention mask, and
the look-backs need the token ids.

The KV cache is transformers' `DynamicCache` (a static cache is refused). Besides keys and
values, the token ids a cache has seen are kept on the cache object (`speedgpt_tokens`): the next
call needs them for the look-backs and the document masks. Keys are cached before the key offset,
which is applied to the whole key sequence each call. Beam search reorders that history along with
the cache (`_reorder_cache`); a cache cropped by assisted decoding crops it on the next call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_speedgpt import SpeedGPTConfig

try:  # transformers >= 5: initializers that leave loaded weights alone
    from transformers import initialization as init
except ImportError:  # pragma: no cover - older transformers
    from torch.nn import init

# Record #62's bigram hash: two odd multipliers; record #54's asymmetric logit map 23 sigmoid((z + 5) / 7.5).
BIGRAM_MUL_CURRENT, BIGRAM_MUL_PREVIOUS = 36313, 27191
RESCALE_HEIGHT, RESCALE_SHIFT, RESCALE_WIDTH = 23.0, 5.0, 7.5
HISTORY = "speedgpt_tokens"  # the attribute of a cache object holding the token ids it has seen


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def sigmoid_gate(x_BTD: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """2 sigmoid(weight . x[:gate_dim]): 1 where the weight is zero."""
    return 2 * torch.sigmoid(F.linear(x_BTD[..., :weight.size(-1)], weight.to(x_BTD.dtype)))


class CastedLinear(nn.Linear):
    """A bias-free linear layer whose weight is cast to the activations' dtype at use (speedgpt keeps
    matrices and scalars in their own dtypes; the compute dtype is the embedding's)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.type_as(x))


def rotary(x_BTHD: torch.Tensor, pos_BT: torch.Tensor, freq: torch.Tensor, *, paired: bool = False,
           scale: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding at each token's position: dims d and d + D/2 form a pair rotating at freq[d]
    (zero for half-truncated rotary's stationary dims); `scale` multiplies the result in fp32 (YaRN's
    attention scale, on the queries)."""
    B, T, H, D = x_BTHD.shape
    if paired:  # head 2p + j of position t rotates at position 2t + j (record #58)
        theta = doubled(pos_BT, positions=True).view(B, T, 2).to(torch.float32)[..., None] * freq  # (B, T, 2, D/2)
        x = x_BTHD.view(B, T, H // 2, 2, D)
    else:
        theta = pos_BT.to(torch.float32)[..., None] * freq  # (B, T, D/2)
        x = x_BTHD
    cos, sin = theta.cos()[:, :, None], theta.sin()[:, :, None]
    x1, x2 = x.float().chunk(2, dim=-1)
    y = torch.cat((x1 * cos + x2 * sin, -x1 * sin + x2 * cos), dim=-1)
    if scale is not None:
        y = y * scale
    return y.type_as(x_BTHD).view(B, T, H, D)


def default_frequencies(config: SpeedGPTConfig, device=None) -> torch.Tensor:
    """speedgpt's rotary frequencies from rope_base (used when the config lists none)."""
    quarter = config.head_dim // 4
    base = config.rope_base
    if config.rope_half_truncate:
        freq = (1.0 / base) ** torch.linspace(0, 1, steps=quarter, dtype=torch.float32, device=device)
        return torch.cat([freq, freq.new_zeros(quarter)])
    return (1.0 / base) ** (torch.arange(0, 2 * quarter, dtype=torch.float32, device=device) / (2 * quarter))


class Batch:
    """What every layer of one forward shares: positions, masks, the key-offset boundaries, rotary state."""

    def __init__(self, pos_new_BT, first_all_BT, masks, freq, query_scale, cache):
        self.pos_new = pos_new_BT  # positions of this call's tokens
        self.first_all = first_all_BT  # per key (cached and new): no previous token to shift from
        self.masks = masks  # "L"/"S" (+ "2" for paired-head layers) -> (B, 1, Tq, Tk) bool
        self.freq = freq
        self.query_scale = query_scale
        self.cache = cache


def attention_mask(q_index, k_index, q_pos, k_pos, q_doc, k_doc, k_valid, window: int, block: int) -> torch.Tensor:
    """(B, 1, Tq, Tk) bool: causal, same document, key valid (not padding) and the key's block within
    ceil(window / block) blocks of the query's. A query always sees itself, so no row is empty."""
    blocks = (window + block - 1) // block
    allowed = k_index[:, None, :] <= q_index[:, :, None]
    allowed = allowed & ((q_pos[:, :, None] // block - k_pos[:, None, :] // block) < blocks)
    allowed = allowed & (q_doc[:, :, None] == k_doc[:, None, :]) & k_valid[:, None, :]
    allowed = allowed | (k_index[:, None, :] == q_index[:, :, None])
    return allowed[:, None]


def doubled(x_BT: torch.Tensor, positions: bool = False) -> torch.Tensor:
    """A per-token tensor over the paired-head layers' sequence of 2T positions (2t, 2t + 1)."""
    if positions:
        return torch.stack([2 * x_BT, 2 * x_BT + 1], dim=-1).flatten(1)
    return x_BT.repeat_interleave(2, dim=1)


def pair_heads(x_BHTD: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B, H/2, 2T, D): position 2t holds heads 0..H/2-1 of token t, 2t + 1 the others."""
    B, H, T, D = x_BHTD.shape
    return x_BHTD.transpose(1, 2).reshape(B, 2 * T, H // 2, D).transpose(1, 2)


class SpeedGPTAttention(nn.Module):
    def __init__(self, config: SpeedGPTConfig, layer: int):
        super().__init__()
        dim, H, KV, Dh = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.layer, self.num_heads, self.num_kv_heads, self.head_dim = layer, H, KV, Dh
        self.scale = config.attention_scale or Dh ** -0.5
        if KV == H:
            self.qkv_w = nn.Parameter(torch.empty(3, H * Dh, dim))
        else:
            self.q_w = nn.Parameter(torch.empty(H * Dh, dim))
            self.kv_w = nn.Parameter(torch.empty(2, KV * Dh, dim))
        self.proj = CastedLinear(H * Dh, dim)
        self.gate = CastedLinear(config.gate_dim, H) if config.attn_gate else None
        self.window_key = config.layer_windows[layer]
        self.paired = layer in config.paired_head_layers
        self.key_offset = layer in config.key_offset_layers
        self.mask_key = self.window_key + ("2" if self.paired else "")

    def qkv(self, x_BTD: torch.Tensor):
        B, T, _ = x_BTD.shape
        H, KV, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        if KV != H:
            q = F.linear(x_BTD, self.q_w.type_as(x_BTD)).view(B, T, H, Dh)
            k, v = F.linear(x_BTD, self.kv_w.flatten(end_dim=1).type_as(x_BTD)).view(B, T, 2 * KV, Dh).chunk(2, dim=-2)
            return q, k, v
        qkv = F.linear(x_BTD, self.qkv_w.flatten(end_dim=1).type_as(x_BTD)).view(B, T, 3 * H, Dh)
        return qkv.chunk(3, dim=-2)

    def forward(self, x_BTD, ve_BTD, v_lambdas, batch: Batch) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, Dh = self.num_heads, self.head_dim
        q, k, v = self.qkv(x_BTD)
        q, k = norm(q), norm(k)
        q = rotary(q, batch.pos_new, batch.freq, paired=self.paired, scale=batch.query_scale)
        k = rotary(k, batch.pos_new, batch.freq, paired=self.paired)
        v = v_lambdas[0] * v + v_lambdas[1] * ve_BTD.view_as(v) if ve_BTD is not None else v_lambdas[0] * v
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, Dh): the cache's layout
        if batch.cache is not None:
            k, v = batch.cache.update(k, v, self.layer)
        if self.key_offset:
            k = offset_keys(k, batch.first_all)
        if self.paired:
            q, k, v = pair_heads(q), pair_heads(k), pair_heads(v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.masks[self.mask_key], scale=self.scale,
                                           enable_gqa=self.num_kv_heads != H)
        y = y.transpose(1, 2).reshape(B, T, H, Dh)  # paired: (B, 2T, H/2, Dh) back to (B, T, H, Dh)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x_BTD[..., :self.gate.in_features])).unsqueeze(-1)
        return self.proj(y.reshape(B, T, H * Dh))


def offset_keys(k_BHTD: torch.Tensor, first_BT: torch.Tensor) -> torch.Tensor:
    """The partial key offset (record #49): each key's stationary quarters ([D/4, D/2) and [3D/4, D))
    come from the previous position's key, except at a row's first token and a document's first."""
    prev = torch.cat([k_BHTD[:, :, :1], k_BHTD[:, :, :-1]], dim=2)
    prev = torch.where(first_BT[:, None, :, None], k_BHTD, prev)
    q4 = k_BHTD.size(-1) // 4
    return torch.cat([k_BHTD[..., :q4], prev[..., q4:2 * q4], k_BHTD[..., 2 * q4:3 * q4], prev[..., 3 * q4:]], dim=-1)


class SpeedGPTMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc = CastedLinear(dim, hidden)
        self.proj = CastedLinear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.relu(self.fc(x)).square())


class SpeedGPTMoE(nn.Module):
    """DeepSeek-V3-style experts: top-k of sigmoid affinity + balancing bias, weights from the affinity
    alone normalized over the chosen k, one shared expert; ReLU^2 experts run one at a time."""

    def __init__(self, config: SpeedGPTConfig):
        super().__init__()
        dim, hidden, E = config.hidden_size, config.moe_hidden, config.moe_experts
        self.experts, self.top_k = E, config.moe_top_k
        self.router = nn.Parameter(torch.empty(E, dim))
        self.w1 = nn.Parameter(torch.empty(E, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(E, dim, hidden))
        self.shared = SpeedGPTMLP(dim, hidden * config.moe_shared_experts) if config.moe_shared_experts else None
        self.register_buffer("expert_bias", torch.zeros(E))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_ND = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(F.linear(x_ND.float(), self.router.float()))
        idx = torch.topk(scores + self.expert_bias.float(), self.top_k, dim=-1, sorted=False).indices
        w = scores.gather(1, idx)
        w = w / w.sum(dim=-1, keepdim=True)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k
        counts = torch.zeros(self.experts, dtype=torch.int64, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat)).tolist()
        x_sorted = x_ND[token]
        outs, start = [], 0
        for e, n in enumerate(counts):
            seg = x_sorted[start:start + n]
            h = F.relu(F.linear(seg, self.w1[e].type_as(seg))).square()
            outs.append(F.linear(h, self.w2[e].type_as(h)))
            start += n
        out = torch.cat(outs) * w.reshape(-1)[order, None].to(x_ND.dtype)
        y = torch.zeros_like(x_ND).index_add_(0, token, out.to(x_ND.dtype))
        if self.shared is not None:
            y = y + self.shared(x_ND)
        return y.view(shape)


class SpeedGPTBlock(nn.Module):
    def __init__(self, config: SpeedGPTConfig, layer: int):
        super().__init__()
        dim = config.hidden_size
        self.attn = SpeedGPTAttention(config, layer) if layer not in config.attention_free_layers else None
        if config.moe_experts and layer >= config.moe_dense_layers:
            self.mlp = SpeedGPTMoE(config)
        else:
            self.mlp = SpeedGPTMLP(dim, config.intermediate_size)
        self.x0_mixing = config.x0_mixing
        has_ve = config.value_embed_slots[layer] is not None
        self.ve_gate = (nn.Parameter(torch.empty(config.num_key_value_heads, config.gate_dim))
                        if config.value_embed_gates and self.attn is not None and has_ve else None)

    def forward(self, x, x0, ve, lambdas, v_lambdas, extra, batch: Batch):
        if self.x0_mixing:
            x = lambdas[0] * x + lambdas[1] * x0
        if extra is not None:
            x = x + extra
        if self.attn is not None:
            h = norm(x)
            if self.ve_gate is not None and ve is not None:
                B, T, D = ve.shape
                K = self.ve_gate.size(0)
                ve = (ve.view(B, T, K, D // K) * sigmoid_gate(h, self.ve_gate).unsqueeze(-1)).view(B, T, D)
            x = x + self.attn(h, ve, v_lambdas, batch)
        return x + self.mlp(norm(x))


class BigramHashEmbedding(nn.Module):
    def __init__(self, rows: int, dim: int, depth: int):
        super().__init__()
        self.rows = rows
        self.embed = nn.Embedding(rows, dim)
        self.lambdas = nn.Parameter(torch.empty(depth))

    def forward(self, tokens_BT: torch.Tensor, prev_BT: torch.Tensor, has_prev_BT: torch.Tensor) -> torch.Tensor:
        """Row (36313 token XOR 27191 previous) mod (rows - 1); the last row where there is no previous token."""
        mod = self.rows - 1
        h = torch.bitwise_xor(BIGRAM_MUL_CURRENT * tokens_BT.long(), BIGRAM_MUL_PREVIOUS * prev_BT.long()) % mod
        return self.embed(torch.where(has_prev_BT, h, mod))


class SmearGate(nn.Module):
    """e_t + lambda sigmoid(w . e_t[:gate_dim]) e_{t-1} (record #34), on the raw token embeddings."""

    def __init__(self, gate_dim: int):
        super().__init__()
        self.gate = nn.Linear(gate_dim, 1, bias=False)
        self.smear_lambda = nn.Parameter(torch.empty(1))

    def forward(self, e_BTD: torch.Tensor, prev_BTD: torch.Tensor) -> torch.Tensor:
        w = self.gate.weight
        g = self.smear_lambda.to(e_BTD.dtype) * torch.sigmoid(F.linear(e_BTD[..., :w.size(-1)], w.to(e_BTD.dtype)))
        return e_BTD + g * prev_BTD


class SkipGates(nn.Module):
    def __init__(self, num_skips: int, gate_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_skips, gate_dim))

    def forward(self, x0_BTD: torch.Tensor, j: int) -> torch.Tensor:
        return sigmoid_gate(x0_BTD, self.weight[j:j + 1])


class SpeedGPTPreTrainedModel(PreTrainedModel):
    config_class = SpeedGPTConfig
    base_model_prefix = "model"
    _no_split_modules = ["SpeedGPTBlock"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        """A fresh model's starting values; from_pretrained replaces them with the export's weights.
        (speedgpt starts its output projections and head at zero, which makes every logit equal;
        here every matrix starts small and random, the scalars at speedgpt's values.)"""
        super()._init_weights(module)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            return
        for name, p in module.named_parameters(recurse=False):
            if name == "block_lambdas":  # x <- 1 x + 0 x0
                start = torch.tensor([1.0, 0.0]).expand_as(p)
                init.copy_(p, start) if hasattr(init, "copy_") else p.data.copy_(start)
            elif name == "skip_weights":
                init.ones_(p)
            elif name == "v_lambdas":
                init.constant_(p, 0.5)
            elif p.ndim >= 2 and name != "ve_gate" and not isinstance(module, SkipGates):
                init.normal_(p, mean=0.0, std=0.02)
            else:  # gates open at 1 (2 sigmoid(0)), smear, bigram and backout shares at zero
                init.zeros_(p)
        for name, b in module.named_buffers(recurse=False):
            if name == "expert_bias":
                init.zeros_(b)


class SpeedGPTModel(SpeedGPTPreTrainedModel):
    """The trunk: token ids (and the cache) in, the final normed hidden states out."""

    def __init__(self, config: SpeedGPTConfig):
        super().__init__(config)
        depth, dim, vocab = config.num_hidden_layers, config.hidden_size, config.vocab_size
        kv_dim = config.num_key_value_heads * config.head_dim
        ve_dim = kv_dim if config.num_key_value_heads != config.num_attention_heads else dim
        self.embed = nn.Embedding(vocab, dim)
        self.value_embeds = nn.ModuleList(nn.Embedding(vocab, ve_dim) for _ in range(config.num_value_embeds))
        self.blocks = nn.ModuleList(SpeedGPTBlock(config, i) for i in range(depth))
        self.num_skips = depth // 2 if config.unet_skips else 0
        self.skip_weights = nn.Parameter(torch.empty(self.num_skips))
        self.block_lambdas = nn.Parameter(torch.empty(depth, 2))
        self.v_lambdas = nn.Parameter(torch.empty(depth, 2))
        self.bigram = BigramHashEmbedding(config.bigram_rows, dim, depth) if config.bigram_rows else None
        self.smear = SmearGate(config.gate_dim) if config.smear else None
        self.skip_gates = SkipGates(self.num_skips, config.gate_dim) if config.skip_gates and self.num_skips else None
        self.backout_lambda = nn.Parameter(torch.empty(1)) if config.backout_layer >= 0 else None
        self.mask_keys = sorted({b.attn.mask_key for b in self.blocks if b.attn is not None})
        self.attention_layers = [i for i, b in enumerate(self.blocks) if b.attn is not None]
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def past_tokens(self, cache, batch: int, device) -> torch.Tensor:
        """The token ids `cache` has seen (B, P), checked against the keys it holds."""
        if cache is None:
            return torch.zeros(batch, 0, dtype=torch.long, device=device)
        if getattr(cache, "is_compileable", False):
            raise ValueError("SpeedGPT runs with transformers' DynamicCache only (a static cache holds unwritten "
                             "positions its masks would have to hide); drop cache_implementation")
        seen = getattr(cache, HISTORY, None)
        cached = cache.get_seq_length(self.attention_layers[0]) if self.attention_layers else (
            0 if seen is None else seen.size(1))
        if seen is None:
            if cached:
                raise ValueError("this cache was filled outside SpeedGPT's forward (its token history is missing); "
                                 "start from an empty DynamicCache")
            return torch.zeros(batch, 0, dtype=torch.long, device=device)
        if seen.size(0) != batch or seen.size(1) < cached:
            raise ValueError(f"the cache holds {cached} positions of a batch of {seen.size(0)}, its token history "
                             f"{seen.size(1)} of {batch}: reordering or re-batching a cache is not supported")
        return seen[:, :cached]  # a cache cropped by assisted decoding: the history follows it

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        config = self.config
        B, T = input_ids.shape
        device = input_ids.device
        past = self.past_tokens(cache, B, device)
        P = past.size(1)
        tokens = torch.cat([past, input_ids], dim=1)  # every position the attention sees
        if cache is not None:
            setattr(cache, HISTORY, tokens)
        if attention_mask is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        else:
            if attention_mask.dim() != 2 or attention_mask.shape != tokens.shape:
                raise ValueError(f"attention_mask must be 2-D (batch, cached + new positions) = {tuple(tokens.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            valid = attention_mask.bool()
        pos = (valid.long().cumsum(dim=1) - 1).clamp_min(0)  # each row's positions count its real tokens
        if bool((pos[:, P:][valid[:, P:]] >= config.max_position_embeddings).any()):
            raise ValueError(f"sequence position {int(pos.max()) + 1} exceeds the model's context "
                             f"({config.max_position_embeddings} tokens, as trained); shorten the input")
        start = pos == 0  # a row's first real token (and its left padding): no previous token
        bos = tokens == config.bos_token_id
        doc = bos.long().cumsum(dim=1) if config.doc_masking else torch.zeros_like(tokens)
        first = start | bos if config.doc_masking else start
        batch = Batch(pos[:, P:], first, self.masks(tokens, pos, doc, valid, P), self.frequencies(device),
                      self.query_scale(device), cache)

        dtype = self.embed.weight.dtype  # the compute dtype
        prev = F.pad(tokens[:, :-1], (1, 0))[:, P:]  # the token before each new one (0 where none)
        has_prev = ~start[:, P:]
        e = self.embed(input_ids).to(dtype)
        if self.smear is not None:
            e_prev = torch.where(has_prev[..., None], self.embed(prev).to(dtype), 0.0)
            e = self.smear(e, e_prev)
        x = x0 = norm(e)
        bigram = self.bigram(input_ids, prev, has_prev).to(dtype) if self.bigram is not None else None
        ves = [ve(input_ids).to(dtype) for ve in self.value_embeds]
        skips: list[torch.Tensor] = []
        depth, n = len(self.blocks), self.num_skips
        x_backout = None
        for i, block in enumerate(self.blocks):
            if n and i >= depth - n:
                skip = skips.pop()
                if self.skip_gates is not None:
                    skip = self.skip_gates(x0, i - (depth - n)) * skip
                x = x + self.skip_weights[i - (depth - n)] * skip
            extra = self.bigram.lambdas[i] * bigram if bigram is not None else None
            slot = config.value_embed_slots[i]
            ve = ves[slot] if slot is not None and ves else None
            x = block(x, x0, ve, self.block_lambdas[i], self.v_lambdas[i], extra, batch)
            if i < n:
                skips.append(x)
            if i == config.backout_layer:
                x_backout = x
        if x_backout is not None:
            x = x - self.backout_lambda[0] * x_backout
        return norm(x)

    def masks(self, tokens, pos, doc, valid, P: int) -> dict[str, torch.Tensor]:
        """One boolean mask per window (and per window of the paired-head layers, over 2T positions)."""
        B, Tk = tokens.shape
        index = torch.arange(Tk, device=tokens.device).expand(B, Tk)
        out = {}
        for key in self.mask_keys:
            window = self.config.attention_windows[0 if key[0] == "L" else 1]
            if key.endswith("2"):
                k_index, k_pos, k_doc, k_valid = doubled(index, True), doubled(pos, True), doubled(doc), doubled(valid)
                q = slice(2 * P, None)
            else:
                k_index, k_pos, k_doc, k_valid = index, pos, doc, valid
                q = slice(P, None)
            out[key] = attention_mask(k_index[:, q], k_index, k_pos[:, q], k_pos, k_doc[:, q], k_doc, k_valid,
                                      window, self.config.window_block)
        return out

    def frequencies(self, device) -> torch.Tensor:
        if self.config.rope_frequencies is None:
            return default_frequencies(self.config, device)
        return torch.tensor(self.config.rope_frequencies, dtype=torch.float32, device=device)

    def query_scale(self, device) -> torch.Tensor | None:
        scale = self.config.query_scale
        return None if scale is None else torch.tensor(scale, dtype=torch.float32, device=device)


class SpeedGPTForCausalLM(SpeedGPTPreTrainedModel, GenerationMixin):
    """Logits over the padded vocabulary (softcapped, fp32), as speedgpt's forward returns them; ids
    at or above the tokenizer's vocabulary are never targets, and generation_config.json suppresses them."""

    def __init__(self, config: SpeedGPTConfig):
        super().__init__(config)
        self.model = SpeedGPTModel(config)
        self.lm_head = CastedLinear(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        if self.config.logit_rescale:
            return RESCALE_HEIGHT * torch.sigmoid((logits + RESCALE_SHIFT) / RESCALE_WIDTH)
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                cache=None, past_key_values=None, inputs_embeds=None, labels: torch.Tensor | None = None,
                use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0, return_dict: bool | None = None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None, **kwargs):
        if input_ids is None or inputs_embeds is not None:
            raise ValueError("SpeedGPT needs input_ids (its smear, bigram and document masks read the token ids); "
                             "inputs_embeds is not supported")
        if kwargs.get("position_ids") is not None:
            raise ValueError("SpeedGPT derives positions from attention_mask (left padding) and the cache; "
                             "drop position_ids")
        if output_attentions or output_hidden_states:
            raise ValueError("SpeedGPT returns logits only: output_attentions / output_hidden_states are not supported")
        unknown = sorted(k for k, v in kwargs.items() if v is not None and v is not False)
        if unknown:
            raise ValueError(f"SpeedGPT's forward does not take {', '.join(unknown)}")
        cache = cache if cache is not None else past_key_values  # transformers < 5.x names it past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is None and use_cache:
            from transformers import DynamicCache

            cache = DynamicCache()
        hidden = self.model(input_ids, attention_mask=attention_mask, cache=cache if use_cache else None)
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        else:
            hidden = hidden[:, logits_to_keep]
        logits = self.softcap(self.lm_head(hidden).float())
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1).long(),
                                   ignore_index=-100)
        cache_field = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{cache_field: cache if use_cache else None})
        return out if return_dict is not False else out.to_tuple()

    def _reorder_cache(self, cache, beam_idx: torch.Tensor):
        """Beam search: the cache's rows and their token history move together."""
        cache.reorder_cache(beam_idx)
        seen = getattr(cache, HISTORY, None)
        if seen is not None:
            setattr(cache, HISTORY, seen.index_select(0, beam_idx.to(seen.device)))
        return cache
