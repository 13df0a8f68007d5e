"""FP8 formats and the dynamic cast every FP8 path shares (the hidden linears in fp8_linear.py, the
fused ReLU² kernels in kernels/relu2_fp8.py, the head's static scales in fp8_head.py)."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0  # largest finite float8_e4m3fn
E5M2_MAX = 57344.0  # largest finite float8_e5m2


def quantize(t: torch.Tensor, dtype: torch.dtype, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(t / scale in `dtype`, row-major, and scale in fp32) with scale = amax / the format's max, per
    row (shape (rows, 1)) or per tensor (shape ()). All-zero rows get a tiny scale and stay zero."""
    fmax = E4M3_MAX if dtype == torch.float8_e4m3fn else E5M2_MAX
    t32 = t.float()
    amax = t32.abs().amax(dim=-1, keepdim=True) if rowwise else t32.abs().amax()
    scale = amax.clamp_min(1e-30) / fmax
    # No clamp before the cast: |t| <= amax, so |t / scale| exceeds fmax by a few float32 roundings at most
    # (< fmax * 2^-20), and the cast rounds that to fmax (the format's next step up is 32 away for e4m3fn, 8,192 for
    # e5m2; the cast gives NaN or inf only past halfway to it). A clamp there cost two graph nodes a cast, ~140 casts
    # in a speedrun step's forward and backward; tests/test_fp8_linear.py checks the casts against a clamped one.
    return (t32 / scale).to(dtype).contiguous(), scale
