"""Rotary position embeddings, optionally half-truncated.

Half-truncation (from the speedrun) gives only the first half of each head's dims a rotation
frequency; the other half get frequency zero and so carry position-free content ("stationary"
dims: the partial key offset, model/attention.py, shifts exactly those).

Two optional inputs change the rotation:
- `tables`: (cos, sin) of every position at other frequencies than the rotary's own (YaRN rescaling as
  the attention window grows, model/yarn.py), made by `tables(freq)` outside the compiled graph. They
  enter as tensors, so a compiled model does not recompile when they change. Made inside the graph
  instead (from the frequencies), Inductor fused the cos and sin into every rotary kernel, computed
  anew for each element a thread holds: speedrun-latest's six slowest kernels, all of them such,
  took 10-13 s each to build on an H100 (wave 23; the next 1.3 s); speedrun-124m's rotary kernels, which read tables,
  2.8 s at most (docs/experiments.md, "YaRN's tables made outside the graph").
- `paired`: paired-head attention (record #58) views each head pair's two heads as two positions
  of a sequence twice as long: head h of position t is rotated at position 2t + (h mod 2).
"""

from __future__ import annotations

import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_seq_len: int, base: float = 1024.0, half_truncate: bool = True,
                 paired: bool = False):
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.half_truncate = half_truncate
        self.max_seq_len = max_seq_len  # the model's context in tokens (sampling and eval read it)
        self.table_len = max_seq_len * (2 if paired else 1)  # paired-head layers rotate 2 positions per token
        # Not persistent: the tables are a function of the config, and so are rebuilt, not checkpointed.
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def frequencies(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Angular frequency (radians per position) of each of the head_dim // 2 rotated pairs of dims."""
        quarter = self.head_dim // 4
        if self.half_truncate:
            freq = (1.0 / self.base) ** torch.linspace(0, 1, steps=quarter, dtype=torch.float32, device=device)
            return torch.cat([freq, freq.new_zeros(quarter)])
        return (1.0 / self.base) ** (torch.arange(0, 2 * quarter, dtype=torch.float32, device=device) / (2 * quarter))

    def stationary_dims(self) -> torch.Tensor:
        """(head_dim,) bool: the dims whose frequency is zero (both halves of each such pair)."""
        still = self.frequencies() == 0
        return torch.cat([still, still])

    def tables(self, freq: torch.Tensor | None = None,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (table_len, head_dim // 2) float32: the angle of every rotated position at `freq`
        (default: the rotary's own frequencies). Not for a compiled graph (the module's docstring says why)."""
        freq = self.frequencies(device) if freq is None else freq.to(device=device, dtype=torch.float32)
        theta = torch.outer(torch.arange(self.table_len, dtype=torch.float32, device=device), freq)
        return theta.cos(), theta.sin()

    def init_tables(self, device: torch.device | str | None = None, freq: torch.Tensor | None = None) -> None:
        """The tables a forward given none rotates by: at `freq` (YaRN's default state) or the rotary's own."""
        self.cos, self.sin = self.tables(freq, device)

    def cos_sin(self, T: int, pos_offset: int = 0, *, paired: bool = False,
                tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotation of T tokens from pos_offset: (cos, sin) of `tables` (`tables()`'s form; default the
        module's), shaped to broadcast against forward's x (viewed (B, T, H/2, 2, D) when paired). Every layer
        of a forward rotates by the same rotation: GPT.forward takes it once a forward
        (AttnContext.rotary_tables) and each attention layer takes its kind's."""
        # Rotated positions: t (or, paired, 2t and 2t + 1 for the two heads of a pair), from pos_offset on.
        n, start = (2 * T, 2 * pos_offset) if paired else (T, pos_offset)
        if pos_offset + T > self.max_seq_len:
            raise ValueError(f"sequence position {pos_offset + T} exceeds the rotary table ({self.max_seq_len}); "
                             f"raise data.seq_len or shorten the input")
        cos, sin = tables if tables is not None else (self.cos, self.sin)
        cos, sin = cos[start:start + n], sin[start:start + n]
        half = self.head_dim // 2
        if paired:  # [t, p, j] of x's paired view is head 2p + j, rotated at position 2t + j
            return cos.view(1, T, 1, 2, half), sin.view(1, T, 1, 2, half)
        return cos[None, :, None, :], sin[None, :, None, :]

    def forward(self, x_BTHD: torch.Tensor, pos_offset: int = 0, *, paired: bool = False,
                scale: torch.Tensor | None = None,
                cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x rotated; `scale` (a 0-d tensor) multiplies the result in float32, before the cast back
        (YaRN's attention scale, applied to the queries: one rounding instead of two); `cos_sin`: the rotation
        cos_sin(T, pos_offset, paired=paired, tables=...) gives, taken once for all layers (default: this
        module's own tables)."""
        B, T, H, D = x_BTHD.shape
        cos, sin = cos_sin if cos_sin is not None else self.cos_sin(T, pos_offset, paired=paired)
        x = x_BTHD.view(B, T, H // 2, 2, D) if paired else x_BTHD
        x1, x2 = x.float().chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = -x1 * sin + x2 * cos
        y = torch.cat((y1, y2), dim=-1)
        if scale is not None:
            y = y * scale
        return y.type_as(x_BTHD).view(B, T, H, D)
