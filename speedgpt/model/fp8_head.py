"""FP8 matmul for the lm_head (Hopper and newer): `fp8_linear`, custom ops with their own backward,
and `fp8_head_cross_entropy`, the head fused with the loss for training (below).

Forward: x and W in e4m3 (more mantissa), output bf16. Backward: the output gradient in e5m2
(more range) times the e4m3 weight gives the input gradient; fp8_linear's weight gradient is a bf16
matmul (see _backward for why).

Scales are static, derived from bounds rather than measured each step (an amax pass over the
49K x 50K logit gradient would cost about as much as the matmul saves):

- x is the RMS-normalized final hidden state: every row has RMS 1, so |x_i| <= sqrt(dim).
  x_scale = sqrt(dim) / 448 maps that bound onto e4m3's largest finite value (448).
- W: the head's weights start at zero and stay small; w_scale = w_bound / 448 keeps |W| <= w_bound
  (default 24, generous) representable while small weights stay in e4m3's normal range.
- grad: the loss is a mean over the step's tokens, so |dL/dlogit| <= 1 / tokens_per_step (softmax
  minus one-hot, times a softcap derivative <= 1). grad_scale = 1 / (tokens_per_step * 448) puts
  that bound at 448, 2^7 below e5m2's maximum (57344), while gradients down to ~3e-8 of the bound
  stay representable.

`fp8_head_cross_entropy` fuses the head with the softcapped cross-entropy for training: Triton
kernels over the bf16 logits (model/kernels/softcap_ce.py) compute the loss and, already in the
forward, the per-token logit gradient, written in e5m2 in both layouts `_scaled_mm` wants (row-
and column-major), so the logits are freed at once, no separate cast pass exists and the weight
gradient is an FP8 matmul too. Its gradient scale is G_SCALE (below); the upstream gradient of the
loss arrives in the backward as a device scalar and is folded into the matmul scales. The op also
takes the kernels' affine logit map (record #54's rescale) and multi-token prediction's K weighted
targets per row, so speedrun-latest's stages train through it too (_FP8HeadCE keeps |G| <= G_SCALE).
It is an autograd.Function whose casts to e4m3 and operand transposes are plain torch ops around two
custom ops (the matmuls and the kernels): under torch.compile, Inductor can fuse x's cast into the
final RMSNorm and writes the 1-byte transposes with its own kernels (aten's copies of them were slow).
"""

from __future__ import annotations

from typing import Optional

import torch

from .fp8_cast import E4M3_MAX  # noqa: F401  (the head's scales are fractions of it)

# Per-token logit gradients (softmax minus one-hot, times a softcap derivative <= 1) lie in [-1, 1].
# Times 2^15 they stay below e5m2's maximum (57344) and values down to 2^-31 (e5m2's smallest
# subnormal, 2^-16, over the scale) survive: far below what a softmax over 50K classes produces.
G_SCALE = 2.0 ** 15


def _to_fp8(t: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    return (t / scale).to(dtype)


def _scale(v: float, device) -> torch.Tensor:
    # Filled on the device, not copied there: torch.tensor(v, device=cuda) copies from pageable host memory,
    # and that copy synchronizes the host with the GPU. The FP8 head called it 4 times a micro-step, so the
    # host never ran ahead of the GPU (a 2-GPU profile of speedrun-latest, 2026-11-28: 8 syncs a step).
    return torch.full((), v, dtype=torch.float32, device=device)


def _mm_e4m3(x8: torch.Tensor, w8: torch.Tensor, x_scale: float, w_scale: float) -> torch.Tensor:
    """x @ w.T in bf16 from x8 (N, D) and w8 (V, D) in e4m3: the FP8 head's forward matmul."""
    return torch._scaled_mm(x8, w8.T, out_dtype=torch.bfloat16, scale_a=_scale(x_scale, x8.device),
                            scale_b=_scale(w_scale, x8.device), use_fast_accum=True)


def _grad_input(g8: torch.Tensor, w8t: torch.Tensor, g_scale: torch.Tensor, w_scale: float) -> torch.Tensor:
    """grad_x = g @ w from an e5m2 gradient and the e4m3 weight transposed, w8t (D, V) row-major
    (_scaled_mm wants its second operand column-major: the view w8t.T), bf16 out."""
    return torch._scaled_mm(g8, w8t.T, out_dtype=torch.bfloat16, scale_a=g_scale,
                            scale_b=_scale(w_scale, g8.device), use_fast_accum=False)


@torch.library.custom_op("speedgpt::fp8_linear_fwd", mutates_args=())
def fp8_linear_fwd(x: torch.Tensor, w: torch.Tensor, x_scale: float, w_scale: float, grad_scale: float,
                   fp8_wgrad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x @ w.T in bf16, w in e4m3); the fp8 weight is kept for the backward.
    grad_scale and fp8_wgrad are unused here: they are inputs so that the backward receives them."""
    w8 = _to_fp8(w, w_scale, torch.float8_e4m3fn)
    return _mm_e4m3(_to_fp8(x, x_scale, torch.float8_e4m3fn), w8, x_scale, w_scale), w8


@fp8_linear_fwd.register_fake
def _(x, w, x_scale, w_scale, grad_scale, fp8_wgrad=False):
    return x.new_empty(x.shape[0], w.shape[0], dtype=torch.bfloat16), torch.empty_like(w, dtype=torch.float8_e4m3fn)


@torch.library.custom_op("speedgpt::fp8_linear_bwd_input", mutates_args=())
def fp8_linear_bwd_input(g8: torch.Tensor, w8: torch.Tensor, grad_scale: float, w_scale: float) -> torch.Tensor:
    """grad_x = g @ w from the e5m2 gradient and the e4m3 weight (bf16 out)."""
    return _grad_input(g8, w8.T.contiguous(), _scale(grad_scale, g8.device), w_scale)  # w8 is small


@fp8_linear_bwd_input.register_fake
def _(g8, w8, grad_scale, w_scale):
    return torch.empty(g8.shape[0], w8.shape[1], dtype=torch.bfloat16, device=g8.device)


def _setup_context(ctx, inputs, output):
    x, _, x_scale, w_scale, grad_scale, *rest = inputs
    _, w8 = output
    ctx.save_for_backward(x, w8)
    ctx.scales = (x_scale, w_scale, grad_scale)
    ctx.fp8_wgrad = bool(rest and rest[0])


def _backward(ctx, grad_out, _grad_w8):
    x, w8 = ctx.saved_tensors
    x_scale, w_scale, grad_scale = ctx.scales
    # Traced into the compiled backward: this cast fuses with the loss gradient that produces grad_out.
    g8 = (grad_out / grad_scale).to(torch.float8_e5m2)
    grad_x = fp8_linear_bwd_input(g8, w8, grad_scale, w_scale)
    if ctx.fp8_wgrad:
        # Record #28's weight gradient: e4m3 input (the forward's cast, recomputed) times the e5m2
        # gradient, fp32 out, contracting over the tokens (model.fp8_head_fp8_wgrad).
        x8 = _to_fp8(x, x_scale, torch.float8_e4m3fn)
        grad_w = torch._scaled_mm(x8.T.contiguous(), g8.T.contiguous().T, out_dtype=torch.float32,
                                  scale_a=_scale(x_scale, x.device), scale_b=_scale(grad_scale, x.device),
                                  use_fast_accum=False).T
        return grad_x, grad_w, None, None, None, None
    # The weight gradient contracts over the 49K tokens: in FP8 it would need the (tokens x vocab)
    # gradient transposed in memory first (a 2.5 GB copy per micro-step, measured slower than this
    # bf16 matmul, which cuBLAS runs on the transposed operand in place).
    grad_w = (grad_out.T @ x.to(grad_out.dtype)).float()
    return grad_x, grad_w, None, None, None, None


fp8_linear_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("speedgpt::fp8_head_ce_fwd", mutates_args=())
def fp8_head_ce_fwd(x8: torch.Tensor, w8: torch.Tensor, targets: torch.Tensor, cap: float, x_scale: float,
                    w_scale: float, ignore_index: int, weights: Optional[torch.Tensor] = None, scale: float = 1.0,
                    shift: float = 0.0, g_scale: float = G_SCALE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed loss, G e5m2 (N, V), G^T e5m2 (V, N)) from the e4m3 operands x8 (N, D) and w8 (V, D),
    G = g_scale * dloss_i / dlogits_ij (see module docstring); weights, scale, shift as in
    kernels/softcap_ce.py's softcap_cross_entropy."""
    from .kernels.softcap_ce import softcap_ce_fp8_grad

    logits = _mm_e4m3(x8, w8, x_scale, w_scale)
    loss, g8, g8t = softcap_ce_fp8_grad(logits, targets, cap, g_scale, ignore_index, weights=weights, scale=scale,
                                        shift=shift)
    del logits  # 4.8 GB at the speedrun shape, not kept for the backward
    return loss.sum(), g8, g8t


@fp8_head_ce_fwd.register_fake
def _(x8, w8, targets, cap, x_scale, w_scale, ignore_index, weights=None, scale=1.0, shift=0.0, g_scale=G_SCALE):
    N, V = x8.shape[0], w8.shape[0]
    e5 = torch.float8_e5m2
    return x8.new_empty((), dtype=torch.float32), x8.new_empty(N, V, dtype=e5), x8.new_empty(V, N, dtype=e5)


@torch.library.custom_op("speedgpt::fp8_head_ce_bwd", mutates_args=())
def fp8_head_ce_bwd(g8: torch.Tensor, g8t: torch.Tensor, x8t: torch.Tensor, w8t: torch.Tensor, dloss: torch.Tensor,
                    x_scale: float, w_scale: float, g_scale: float = G_SCALE) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x bf16 (N, D), grad_w fp32 (V, D)) from the e5m2 gradient (scaled by g_scale) in both layouts and
    the e4m3 operands transposed, x8t (D, N) and w8t (D, V): _scaled_mm wants its first operand row-major (G,
    G^T) and its second column-major (the views x8t.T, w8t.T)."""
    g_scale = (dloss.float() / g_scale).reshape(())
    grad_x = _grad_input(g8, w8t, g_scale, w_scale)
    grad_w = torch._scaled_mm(g8t, x8t.T, scale_a=g_scale, scale_b=_scale(x_scale, g8.device),
                              out_dtype=torch.float32, use_fast_accum=False)
    return grad_x, grad_w


@fp8_head_ce_bwd.register_fake
def _(g8, g8t, x8t, w8t, dloss, x_scale, w_scale, g_scale=G_SCALE):
    N, V, D = g8.shape[0], g8.shape[1], w8t.shape[0]
    return g8.new_empty(N, D, dtype=torch.bfloat16), g8.new_empty(V, D, dtype=torch.float32)


class _FP8HeadCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, targets, cap, x_scale, w_scale, ignore_index, weights, scale, shift):
        # Rounded as compiled code rounds, so that eager and compiled results agree bit for bit: Inductor
        # keeps the product in fp32 (no bf16 rounding in between) and, on GPUs, turns a division by a
        # constant into this multiplication by its reciprocal.
        x8 = (x.float() * (1.0 / x_scale)).to(torch.float8_e4m3fn)
        w8 = (w.float() * (1.0 / w_scale)).to(torch.float8_e4m3fn)
        # G's bound |G| <= G_SCALE (module docstring) holds for one target and a map of factor |scale| <= 1.
        # A larger factor lowers the scale; weights summing past 1 (multi-token prediction: 1.75 for
        # [1, .5, .25]) are divided by their sum here, and the loss and its gradient multiplied back.
        g_scale = G_SCALE / max(1.0, abs(scale))
        norm = None
        if weights is not None:
            norm = weights.float().sum().clamp(min=1.0)
            weights = weights.float() / norm
        loss, g8, g8t = fp8_head_ce_fwd(x8, w8, targets, cap, x_scale, w_scale, ignore_index, weights, scale, shift,
                                        g_scale)
        ctx.save_for_backward(g8, g8t, x8.t().contiguous(), w8, norm)
        ctx.meta = (x_scale, w_scale, x.dtype, w.dtype, g_scale)
        # the only output: G and G^T are saved, never outputs autograd would fill with zeros
        return loss if norm is None else loss * norm

    @staticmethod
    def backward(ctx, dloss):
        g8, g8t, x8t, w8, norm = ctx.saved_tensors
        x_scale, w_scale, x_dtype, w_dtype, g_scale = ctx.meta
        if norm is not None:
            dloss = dloss * norm
        grad_x, grad_w = fp8_head_ce_bwd(g8, g8t, x8t, w8.t().contiguous(), dloss, x_scale, w_scale, g_scale)
        return grad_x.to(x_dtype), grad_w.to(w_dtype), None, None, None, None, None, None, None, None


def fp8_head_cross_entropy(x_2d: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, cap: float,
                           x_scale: float, w_scale: float, reduction: str = "mean",
                           ignore_index: int = -100, *, weights: torch.Tensor | None = None, scale: float = 1.0,
                           shift: float = 0.0) -> torch.Tensor:
    """Softcapped cross-entropy of the FP8 head's logits x_2d @ w.T, for training (see module
    docstring); reduction "mean" (over non-ignored targets; with weights over the rows) or "sum".
    weights (multi-token prediction, targets (N, K)) and the logits' affine map scale, shift: as in
    kernels/softcap_ce.py's softcap_cross_entropy."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"fp8_head_cross_entropy: reduction must be mean or sum, not {reduction!r}")
    loss_sum = _FP8HeadCE.apply(x_2d, w, targets.contiguous(), float(cap), float(x_scale), float(w_scale),
                                int(ignore_index), weights, float(scale), float(shift))
    if reduction == "sum":
        return loss_sum
    return loss_sum / x_2d.shape[0] if weights is not None else loss_sum / (targets != ignore_index).sum()


def fp8_linear(x_2d: torch.Tensor, w: torch.Tensor, x_scale: float, w_scale: float, grad_scale: float,
               fp8_wgrad: bool = False) -> torch.Tensor:
    """bf16 x_2d @ w.T through FP8 operands; differentiable in x and w. fp8_wgrad: the weight gradient
    as an FP8 matmul (record #28) instead of a bf16 one."""
    return fp8_linear_fwd(x_2d, w, x_scale, w_scale, grad_scale, fp8_wgrad)[0]
