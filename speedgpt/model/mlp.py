"""The dense MLP of a block (and of each expert of an MoE layer, model/moe.py): ReLU² between two
projections, in FP8 where asked for and the shapes allow. Its own module so that gpt.py and moe.py
both build on it without importing each other."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import CastedLinear, init_from_plan
from .fp8_linear import fits_fp8, fp8_linear_dynamic, fp8_relu2_mlp


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, *, fp8_scaling: str = "", fused_act: bool = False):
        super().__init__()
        self.fc = CastedLinear(dim, hidden)
        self.proj = CastedLinear(hidden, dim)
        # FP8 matmuls where asked for and the shapes allow (_scaled_mm wants multiples of 16)
        self.fp8_scaling = fp8_scaling if fits_fp8(self.fc.weight, self.proj.weight) else ""
        # rowwise only: ReLU² and its FP8 casts in one kernel each way
        self.fused_act = fused_act and self.fp8_scaling == "rowwise"

    def init_plan(self, prefix: str = "") -> list:
        """(parameter name, fill function) in initialization order: see GPT.init_plan."""
        bound = (3 ** 0.5) * 0.5 * self.fc.in_features ** -0.5
        return [(prefix + "fc.weight", lambda t: t.uniform_(-bound, bound)),
                (prefix + "proj.weight", torch.Tensor.zero_)]

    init_weights = init_from_plan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_act:
            return fp8_relu2_mlp(x, self.fc.weight, self.proj.weight)
        if self.fp8_scaling:
            h = fp8_linear_dynamic(x, self.fc.weight, self.fp8_scaling)
            return fp8_linear_dynamic(F.relu(h).square(), self.proj.weight, self.fp8_scaling)
        return self.proj(F.relu(self.fc(x)).square())
