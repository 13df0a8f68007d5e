"""Rotary position embeddings, optionally half-truncated.

Half-truncation (from the speedrun) gives only the first half of each head's dims a rotation
frequency; the other half get frequency zero and so carry position-free content.
"""

from __future__ import annotations

import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_seq_len: int, base: float = 1024.0, half_truncate: bool = True):
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.half_truncate = half_truncate
        self.max_seq_len = max_seq_len
        # Not persistent: the tables are a function of the config, and so are rebuilt, not checkpointed.
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def init_tables(self, device: torch.device | str | None = None) -> None:
        quarter = self.head_dim // 4
        if self.half_truncate:
            freq = (1.0 / self.base) ** torch.linspace(0, 1, steps=quarter, dtype=torch.float32, device=device)
            freq = torch.cat([freq, freq.new_zeros(quarter)])
        else:
            freq = (1.0 / self.base) ** (torch.arange(0, 2 * quarter, dtype=torch.float32, device=device) / (2 * quarter))
        t = torch.arange(self.max_seq_len, dtype=torch.float32, device=device)
        theta = torch.outer(t, freq)
        self.cos = theta.cos()
        self.sin = theta.sin()

    def forward(self, x_BTHD: torch.Tensor, pos_offset: int = 0) -> torch.Tensor:
        T = x_BTHD.size(-3)
        if pos_offset + T > self.cos.size(0):
            raise ValueError(f"sequence position {pos_offset + T} exceeds the rotary table ({self.cos.size(0)}); "
                             f"raise data.seq_len or shorten the input")
        cos = self.cos[None, pos_offset:pos_offset + T, None, :]
        sin = self.sin[None, pos_offset:pos_offset + T, None, :]
        x1, x2 = x_BTHD.float().chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = -x1 * sin + x2 * cos
        return torch.cat((y1, y2), dim=-1).type_as(x_BTHD)
