"""Launching the fused softcapped cross-entropy's Triton kernels (softcap_ce_kernels.py): their
launch parameters (CONFIG, which scripts/gpu_check_ce.py sweeps and softcap_ce.CONFIG exposes),
the argument packing, and the forward, backward and e5m2-gradient calls that softcap_ce.py's ops make
on CUDA (or on CPU under the Triton interpreter)."""

from __future__ import annotations

import math

import torch

from . import softcap_ce_kernels as kernels  # (its kernels exist only where Triton does: read them at launch)
from .softcap_ce_kernels import TANH_MODES, FIXED_MAX_CAP
from .triton_support import triton

# Launch parameters; scripts/gpu_check_ce.py sweeps these. One program per row, the vocab in
# chunks of block_v columns. Hopper: 4096-8192 columns per iteration and 8-16 warps.
CONFIG = {
    "fwd_block_v": 4096, "fwd_warps": 8,
    "bwd_block_v": 4096, "bwd_warps": 8,
    "tanh": "exp",  # exp | libdevice | approx (see _capped_log2)
    # e5m2 gradient: one (rows x vocab) tile per program. On the GPU the f16 kernel runs where the tiles
    # divide the shape; 64 x 128 with 8 warps ran at the memory floor (benchmarks/ce_grad.py, H100:
    # 3.64 ms at 49152 x 50304, a copy with the same traffic 3.59 ms; 32 x 256 took 4.9 ms). The general
    # kernel's tanh is the one-instruction approximation (~2^-11 relative error, far below e5m2's 2^-3).
    "fp8g_block_n": 64, "fp8g_block_v": 128, "fp8g_warps": 8, "fp8g_tanh": "approx",
    "fp8g_fast": True,  # the f16 kernel where tiles divide the shape and 0 < cap <= 40 (sm_89+; its docstring)
}


def _rows(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"softcap_cross_entropy wants 2-D logits (rows, vocab), got {tuple(logits.shape)}")
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def _launch_args(weights, scale, shift, dummy):
    """The kernels' (W, a, b) arguments and (AFFINE, K, HAS_W) constants. Without weights W is `dummy`
    (unread); K targets per row come with K weights (_check_targets made them agree)."""
    affine = scale != 1.0 or shift != 0.0
    k = 1 if weights is None else weights.numel()
    return ((dummy if weights is None else weights, float(scale), float(shift)),
            dict(AFFINE=affine, K=k, HAS_W=weights is not None))


def _triton_fwd(logits, targets, cap, ignore_index, weights=None, scale=1.0, shift=0.0):
    x = _rows(logits)
    N, V = x.shape
    loss = torch.empty(N, dtype=torch.float32, device=x.device)
    lse = torch.empty(N, dtype=torch.float32, device=x.device)
    if N:
        (w, a, b), consts = _launch_args(weights, scale, shift, loss)
        kernels._softcap_ce_fwd_kernel[(N,)](
            x, x.stride(0), targets, w, loss, lse, V, float(cap), a, b, int(ignore_index),
            HAS_CAP=cap > 0, FIXED_MAX=0 < cap <= FIXED_MAX_CAP, TANH=TANH_MODES[CONFIG["tanh"]], **consts,
            BLOCK_V=min(CONFIG["fwd_block_v"], triton.next_power_of_2(V)), num_warps=CONFIG["fwd_warps"])
    return loss, lse


def _triton_bwd(logits, targets, lse, dloss, cap, ignore_index, out, weights=None, scale=1.0, shift=0.0):
    x = _rows(logits)
    N, V = x.shape
    if N:
        (w, a, b), consts = _launch_args(weights, scale, shift, lse)
        kernels._softcap_ce_bwd_kernel[(N,)](
            x, x.stride(0), out, out.stride(0), targets, w, lse, dloss, dloss.stride(0), V, float(cap), a, b,
            int(ignore_index), HAS_CAP=cap > 0, TANH=TANH_MODES[CONFIG["tanh"]], **consts,
            BLOCK_V=min(CONFIG["bwd_block_v"], triton.next_power_of_2(V)), num_warps=CONFIG["bwd_warps"])
    return out


def _fast_kernel_device(device: torch.device) -> bool:
    """The f16 kernel's PTX (f16x2 tanh, e5m2x2 conversion) needs an NVIDIA GPU of compute capability 8.9+."""
    return (device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (8, 9))


def _triton_fp8_grad(logits, targets, cap, g_scale, ignore_index, fp8_dtype, weights=None, scale=1.0, shift=0.0):
    x = _rows(logits)
    N, V = x.shape
    loss, lse = _triton_fwd(x, targets, cap, ignore_index, weights, scale, shift)
    g = torch.empty(N, V, dtype=fp8_dtype, device=x.device)
    gt = torch.empty(V, N, dtype=fp8_dtype, device=x.device)
    if N:
        bn, bv = CONFIG["fp8g_block_n"], CONFIG["fp8g_block_v"]
        if bv * N >= 2 ** 31 or bn * max(V, x.stride(0)) >= 2 ** 31 or targets.numel() >= 2 ** 31:
            raise ValueError(f"softcap_ce_fp8_grad: {N} rows x {V} columns overflow the kernel's 32-bit tile "
                             f"offsets; use fewer rows per call")
        grid = (triton.cdiv(N, bn), triton.cdiv(V, bv))
        even = N % bn == 0 and V % bv == 0
        (w, a, b), consts = _launch_args(weights, scale, shift, lse)
        g_scale = g_scale * scale  # dz/dx carries the affine map's factor
        if (CONFIG["fp8g_fast"] and even and bn % 2 == 0 and fp8_dtype == torch.float8_e5m2
                and 0 < g_scale <= 2.0 ** 15 and 0 < cap <= FIXED_MAX_CAP and _fast_kernel_device(x.device)):
            kernels._softcap_ce_fp8_grad_fast_kernel[grid](
                x, x.stride(0), targets, w, lse, g, gt.view(torch.int16), N, V, float(cap), a, b, float(g_scale),
                math.log2(g_scale), int(ignore_index), HAS_CAP=cap > 0, **consts, BLOCK_N=bn, BLOCK_V=bv,
                num_warps=CONFIG["fp8g_warps"])
        else:
            kernels._softcap_ce_fp8_grad_kernel[grid](
                x, x.stride(0), targets, w, lse, g, gt, N, V, float(cap), a, b, float(g_scale), int(ignore_index),
                HAS_CAP=cap > 0, TANH=TANH_MODES[CONFIG["fp8g_tanh"]], **consts, BLOCK_N=bn, BLOCK_V=bv,
                EVEN=even, num_warps=CONFIG["fp8g_warps"])
    return loss, g, gt
