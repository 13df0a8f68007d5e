"""Residual-stream switches of the later speedrun records (each off by default; see config/model.py).

- Value-embedding gates (record #55): each head's value embedding is scaled by 2 sigmoid(w . x[:12])
  of the block's normed input, a factor 1 at init (zero w).
- Skip gates (record #55): each U-net skip is scaled by 2 sigmoid(w . x0[:12]), also 1 at init.
- Asymmetric logit rescale (record #54): 23 sigmoid((z + 5) / 7.5) in place of the softcap.
- Mimetic V/O init (record #64): V and O start as +-sqrt(beta) identity blocks per head plus noise,
  so V O ~ -beta I and attention contributes from the first step.
Backout (record #40) is two lines in GPT.forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Record #54: logits = 23 sigmoid((z + 5) / 7.5). Cross-entropy ignores a constant shift, so this equals
# 11.5 tanh((z + 5) / 15): a softcap of 11.5 on logits scaled by 11.5 / 15 and shifted by 5.
RESCALE_HEIGHT, RESCALE_SHIFT, RESCALE_WIDTH = 23.0, 5.0, 7.5
RESCALE_CAP = RESCALE_HEIGHT / 2
RESCALE_SLOPE = RESCALE_CAP / (2 * RESCALE_WIDTH)


def rescale_logits(logits: torch.Tensor) -> torch.Tensor:
    """Record #54's asymmetric logit map (values in (0, 23))."""
    return RESCALE_HEIGHT * torch.sigmoid((logits + RESCALE_SHIFT) / RESCALE_WIDTH)


def rescale_for_softcap(logits: torch.Tensor) -> torch.Tensor:
    """The affine map after which cap 11.5 * tanh(. / 11.5) gives record #54's logits less 11.5, so the
    fused softcap cross-entropy kernels compute its loss unchanged."""
    return (logits + RESCALE_SHIFT) * RESCALE_SLOPE


def rescale_as_affine_softcap() -> tuple[float, float, float]:
    """(cap, scale, shift) with cap * tanh((scale * z + shift) / cap) record #54's logits less 11.5: the
    map as the fused loss kernels take it (in fp32, on the head's logits as they are read)."""
    return RESCALE_CAP, RESCALE_SLOPE, RESCALE_SHIFT * RESCALE_SLOPE


def sigmoid_gate(x_BTD: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """2 sigmoid(weight . x[:gate_dim]): (B, T, rows of weight); 1 where weight is zero."""
    return 2 * torch.sigmoid(F.linear(x_BTD[..., :weight.size(-1)], weight.to(x_BTD.dtype)))


def gate_value_embed(ve_BTD: torch.Tensor, x_BTD: torch.Tensor, weight_KG: torch.Tensor) -> torch.Tensor:
    """The value embedding with each of its K heads scaled by its gate (record #55)."""
    B, T, D = ve_BTD.shape
    K = weight_KG.size(0)
    return (ve_BTD.view(B, T, K, D // K) * sigmoid_gate(x_BTD, weight_KG).unsqueeze(-1)).view(B, T, D)


class SkipGates(nn.Module):
    """One gate per U-net skip connection, read from x0 (record #55 has one skip and one gate)."""

    def __init__(self, num_skips: int, gate_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_skips, gate_dim))

    def init_plan(self, prefix: str = "") -> list:
        return [(prefix + "weight", torch.Tensor.zero_)]

    def forward(self, x0_BTD: torch.Tensor, j: int) -> torch.Tensor:
        return sigmoid_gate(x0_BTD, self.weight[j:j + 1])  # (B, T, 1)


def mimetic_fills(beta: float, heads: int, head_dim: int, noise_std: float = 0.01):
    """Fills for the merged qkv weight (3, H*Dh, dim) and the output projection (dim, H*Dh): q and k
    keep `qkv_fill`, V gets sqrt(beta) I and O -sqrt(beta) I per head, each plus N(0, noise_std^2)
    (record #64: beta 0.05, noise 0.01; it needs H*Dh == dim)."""
    root = beta ** 0.5

    def identity_plus_noise(t: torch.Tensor, sign: float) -> None:
        t.normal_(0.0, noise_std)
        for h in range(heads):
            block = t[h * head_dim:(h + 1) * head_dim, h * head_dim:(h + 1) * head_dim]
            block.diagonal().add_(sign * root)

    def wrap_qkv(qkv_fill):
        def fill(t: torch.Tensor) -> None:
            qkv_fill(t)
            identity_plus_noise(t[2], 1.0)
        return fill

    return wrap_qkv, lambda t: identity_plus_noise(t, -1.0)
