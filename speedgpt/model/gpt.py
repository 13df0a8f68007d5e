"""Decoder-only GPT in the speedrun's shape.

Token embedding normalized, RMSNorm without weights, QK-norm, rotary embeddings, merged QKV,
ReLU² MLP, zero-initialized output projections, value embeddings shared U-shaped across layers,
U-net skip connections, x0 mixing per block, optional attention-free layers, untied lm_head over
a padded vocabulary, and a tanh logit softcap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .fp8 import E4M3_MAX, fp8_head_cross_entropy, fp8_linear, fp8_supported
from .fp8_linear import fp8_linear_dynamic, fp8_relu2_mlp
from .kernels.softcap_ce import available as fused_ce_available, softcap_cross_entropy
from .attention import AttnContext, CastedLinear, CausalSelfAttention, KVCache, build_context, norm
from .rotary import Rotary

BOS_ID = 50256


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc = CastedLinear(dim, hidden)
        self.proj = CastedLinear(hidden, dim)
        self.fp8_scaling = ""  # "rowwise" / "tensorwise": FP8 matmuls, set by build_model where supported
        self.fused_act = False  # rowwise only: ReLU² and its FP8 casts in one kernel each way

    @torch.no_grad()
    def init_weights(self) -> None:
        bound = (3 ** 0.5) * 0.5 * self.fc.in_features ** -0.5
        self.fc.weight.uniform_(-bound, bound)
        self.proj.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8_scaling == "rowwise" and self.fused_act:
            return fp8_relu2_mlp(x, self.fc.weight, self.proj.weight)
        if self.fp8_scaling:
            h = fp8_linear_dynamic(x, self.fc.weight, self.fp8_scaling)
            return fp8_linear_dynamic(F.relu(h).square(), self.proj.weight, self.fp8_scaling)
        return self.proj(F.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: Rotary, has_attn: bool):
        super().__init__()
        dim = cfg.resolved_dim()
        scale = cfg.attn_scale or cfg.head_dim ** -0.5
        self.attn = (CausalSelfAttention(dim, cfg.resolved_heads(), cfg.head_dim, rotary, scale=scale,
                                         gate_dim=cfg.attn_gate_dim if cfg.attn_gate else 0)
                     if has_attn else None)
        self.mlp = MLP(dim, int(cfg.mlp_ratio * dim))

    def init_weights(self) -> None:
        if self.attn is not None:
            self.attn.init_weights()
        self.mlp.init_weights()

    def forward(self, x, x0, ve, lambdas, v_lambdas, ctx: AttnContext, window_key: str, window,
                layer: int, kv_cache: KVCache | None, x0_mixing: bool, block: int):
        if x0_mixing:
            x = lambdas[0] * x + lambdas[1] * x0
        if self.attn is not None:
            x = x + self.attn(norm(x), ve, v_lambdas, ctx, window_key, window, layer, kv_cache, block)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        depth, dim, vocab = cfg.depth, cfg.resolved_dim(), cfg.padded_vocab()
        self.vocab_size = cfg.vocab_size
        self.embed = nn.Embedding(vocab, dim)
        self.value_embeds = nn.ModuleList(nn.Embedding(vocab, dim) for _ in range(cfg.value_embeds))
        self.rotary = Rotary(cfg.head_dim, max_seq_len, cfg.rope_base, cfg.rope_half_truncate)
        self.blocks = nn.ModuleList(Block(cfg, self.rotary, i not in cfg.attn_free_layers) for i in range(depth))
        self.lm_head = CastedLinear(dim, vocab)
        self.num_skips = depth // 2 if cfg.unet_skips else 0
        self.skip_weights = nn.Parameter(torch.empty(self.num_skips))
        self.block_lambdas = nn.Parameter(torch.empty(depth, 2))  # x <- l0 * x + l1 * x0
        self.v_lambdas = nn.Parameter(torch.empty(depth, 2))  # v <- l0 * v + l1 * value_embed
        self.window_keys = (cfg.window_pattern * depth)[:depth]
        self.compute_dtype = torch.float32
        self.windows = (max_seq_len, max_seq_len)  # (long, short) used when forward gets none
        self.window_block = 128  # windows are whole blocks of this many tokens (flex's block size)
        self.attn_backend = "sdpa"
        self.fp8_head = False  # switched on by build_model where the device supports it
        self.fused_ce = False  # likewise: the loss through model/kernels/softcap_ce.py
        self.fp8_w_bound = 24.0
        self.fp8_grad_scale = 1.0 / E4M3_MAX  # set by the trainer from tokens per step (see model/fp8.py)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialize every parameter; called after `to_empty` so big models never live on the CPU."""
        nn.init.normal_(self.embed.weight)
        for ve in self.value_embeds:
            nn.init.normal_(ve.weight)
        for block in self.blocks:
            block.init_weights()
        self.lm_head.weight.zero_()  # uniform predictions at init: loss starts at ln(padded vocab)
        self.skip_weights.fill_(1.0)
        self.block_lambdas.copy_(torch.tensor([1.0, 0.0]).expand_as(self.block_lambdas))
        self.v_lambdas.fill_(0.5)
        self.rotary.init_tables(self.embed.weight.device)

    def value_embed_for_layer(self, ves: list[torch.Tensor], i: int) -> torch.Tensor | None:
        k, depth = len(ves), len(self.blocks)
        if i < k:
            return ves[i]
        if i >= depth - k:
            return ves[i - (depth - k)]
        return None

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by optimizer role: hidden matrices go to Muon, the rest to Adam."""
        matrices = [p for p in self.blocks.parameters() if p.ndim >= 2]
        return {
            "matrix": matrices,
            "embed": [self.embed.weight],
            "value_embed": [ve.weight for ve in self.value_embeds],
            "head": [self.lm_head.weight],
            "scalar": [p for p in (self.skip_weights, self.block_lambdas, self.v_lambdas) if p.numel()],
        }

    def record28_transposed(self) -> list[nn.Parameter]:
        """Hidden matrices that record #28 stores transposed relative to this model's (out, in) layout:
        the MLP input weights (its c_fc is (dim, hidden), used as x @ c_fc). Its Muon shape factor is
        computed on that layout (optim.muon_shape_factor = "record28")."""
        return [b.mlp.fc.weight for b in self.blocks]

    def forward(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor | None = None, *,
                reduction: str = "mean", windows=None,
                kv_cache: KVCache | None = None, ctx: AttnContext | None = None) -> torch.Tensor:
        cfg = self.cfg
        windows = self.windows if windows is None else windows
        if kv_cache is None and ctx is None:
            ctx = build_context(inputs_BT, backend=self.attn_backend, windows=windows,
                                doc_masking=cfg.doc_masking, bos_id=BOS_ID, patterns=self.window_keys,
                                block=self.window_block)
        dtype = self.compute_dtype
        x = x0 = norm(self.embed(inputs_BT).to(dtype))
        ves = [ve(inputs_BT).to(dtype) for ve in self.value_embeds]
        skips: list[torch.Tensor] = []
        depth, n = len(self.blocks), self.num_skips
        for i, block in enumerate(self.blocks):
            if n and i >= depth - n:
                x = x + self.skip_weights[i - (depth - n)] * skips.pop()
            key = self.window_keys[i]
            window = windows[0] if key == "L" else windows[1]
            x = block(x, x0, self.value_embed_for_layer(ves, i), self.block_lambdas[i], self.v_lambdas[i],
                      ctx, key, window, i, kv_cache, cfg.x0_mixing, self.window_block)
            if i < n:
                skips.append(x)
        if kv_cache is not None:
            kv_cache.pos += inputs_BT.size(1)
        x = norm(x)
        B, T, D = x.shape
        if (self.fp8_head and self.fused_ce and targets_BT is not None and reduction in ("mean", "sum")
                and torch.is_grad_enabled()):
            # training: head + loss + logit gradient fused; the logits never leave its custom op (model/fp8.py)
            return fp8_head_cross_entropy(x.reshape(B * T, D), self.lm_head.weight, targets_BT.reshape(-1),
                                          cfg.logit_softcap, D ** 0.5 / E4M3_MAX, self.fp8_w_bound / E4M3_MAX,
                                          reduction)
        if self.fp8_head and (self.training or not cfg.fp8_head_train_only):
            logits = fp8_linear(x.reshape(B * T, D), self.lm_head.weight, D ** 0.5 / E4M3_MAX,
                                self.fp8_w_bound / E4M3_MAX, self.fp8_grad_scale,
                                cfg.fp8_head_fp8_wgrad).view(B, T, -1)
        else:
            logits = self.lm_head(x)
        if self.fused_ce and targets_BT is not None:
            # fp32 softcap + cross-entropy in one kernel pair; the backward overwrites the (unused) logits
            loss = softcap_cross_entropy(logits.view(-1, logits.size(-1)), targets_BT.reshape(-1),
                                         cfg.logit_softcap, reduction, inplace_backward=True)
            return loss.view_as(targets_BT) if reduction == "none" else loss
        logits = logits.float()
        if cfg.logit_softcap:
            logits = cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)
        if targets_BT is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets_BT.reshape(-1).long(), reduction=reduction)
        return loss.view_as(targets_BT) if reduction == "none" else loss

    def num_params(self, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not embeddings:
            n -= self.embed.weight.numel() + sum(ve.weight.numel() for ve in self.value_embeds)
        return n

    def flops_per_token(self, seq_len: int, windows: tuple[int, int] | None = None) -> float:
        """Training FLOPs per token: 6 x matmul parameters, plus attention scores and values over the
        average number of keys a query sees (causal, capped by its window)."""
        windows = self.windows if windows is None else windows
        matmul = self.num_params(embeddings=False) - sum(p.numel() for p in self.param_groups()["scalar"])
        attn = 0.0
        hdim = self.cfg.resolved_heads() * self.cfg.head_dim
        for block, key in zip(self.blocks, self.window_keys):
            if block.attn is None:
                continue
            window = windows[0] if key == "L" else windows[1]
            keys = min(window, (seq_len + 1) / 2)
            attn += 12 * hdim * keys  # fwd 2 matmuls x 2 FLOPs, x3 for fwd+bwd
        return 6 * matmul + attn


def build_model(cfg: ModelConfig, max_seq_len: int, device: torch.device | str, *, seed: int = 0,
                dtype: torch.dtype = torch.float32, attn_backend: str = "sdpa", window_block: int = 128) -> GPT:
    """Build on the meta device, allocate on `device`, then initialize there (seeded)."""
    device = torch.device(device)
    with torch.device("meta"):
        model = GPT(cfg, max_seq_len)
    model.to_empty(device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model.init_weights()
    model.compute_dtype = dtype
    model.attn_backend = attn_backend
    model.window_block = window_block
    model.fp8_head = cfg.fp8_head and fp8_supported(device)
    model.fp8_w_bound = cfg.fp8_head_w_bound
    model.fused_ce = cfg.fused_ce and device.type == "cuda" and fused_ce_available(device)
    if cfg.fp8_mlp or cfg.fp8_attn:
        _enable_fp8_matmuls(model, cfg, fp8_supported(device))
    if cfg.bf16_embeds:
        for emb in [model.embed, *model.value_embeds]:
            emb.to(torch.bfloat16)
    return model


def _enable_fp8_matmuls(model: GPT, cfg: ModelConfig, supported: bool) -> None:
    """Switch the hidden matmuls the config names to FP8 where the device can run them: _scaled_mm
    wants both dims of every weight to be multiples of 16."""
    def fits(*weights: torch.Tensor) -> bool:
        return supported and all(n % 16 == 0 for w in weights for n in w.shape[-2:])

    for block in model.blocks:
        if cfg.fp8_mlp and fits(block.mlp.fc.weight, block.mlp.proj.weight):
            block.mlp.fp8_scaling = cfg.fp8_mlp_scaling
            block.mlp.fused_act = cfg.fp8_mlp_fused_act
        if cfg.fp8_attn and block.attn is not None and fits(block.attn.qkv_w, block.attn.proj.weight):
            block.attn.fp8_scaling = cfg.fp8_mlp_scaling
