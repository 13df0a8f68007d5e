"""FP8 linear layers with dynamic scales, for the hidden matmuls (MLP, attention projections), on
Hopper and newer.

Unlike the lm_head (model/fp8_head.py), hidden activations and their gradients have no bound to derive
a static scale from, so each operand is scaled by its own absolute maximum when it is cast:

- "rowwise": one scale per row of each operand (per token for activations and gradients, per
  output unit for weights), all operands e4m3. A row's scale is a reduction over that row only,
  so Inductor computes it inside the kernel that produces the row (the RMSNorm, the ReLU² and its
  backward) rather than in a pass of its own.
- "tensorwise": one scale per tensor; e4m3 forward, e5m2 gradient (its wider range stands in for
  the per-row scales). The global amax costs a separate reduction pass.

Measured on an H100 at the speedrun's MLP shape (benchmarks/mlp.py): the FP8 GEMMs take
0.17-0.22 ms against 0.31-0.34 ms in bf16, but Inductor's ReLU² kernels with the fused casts read
each 3072-wide row twice, so the MLP's forward + backward gains only ~5 % (rowwise; tensorwise is
slower than bf16). `fp8_relu2_mlp` does the activation and its casts in one read per row (its own
Triton kernels): ~8 %, and 2 % more of the whole step (docs/benchmarks.md).

Forward and input gradient run in FP8; the weight gradient, which contracts over the 49K tokens of
a micro-batch, stays a bf16 matmul (in FP8 it would need the token-major operands transposed in
memory first). The function is a plain autograd.Function of traceable torch ops, so
torch.compile fuses the casts into the neighbouring elementwise kernels.
"""

from __future__ import annotations

import torch

from .fp8_cast import quantize

SCALINGS = ("rowwise", "tensorwise")


def fits_fp8(*weights: torch.Tensor) -> bool:
    """Whether _scaled_mm can take these weights: both dims of every one a multiple of 16."""
    return all(n % 16 == 0 for w in weights for n in w.shape[-2:])


def _mm(a8: torch.Tensor, sa: torch.Tensor, b8_t: torch.Tensor, sb: torch.Tensor, rowwise: bool,
        fast_accum: bool) -> torch.Tensor:
    """a @ b.T from a8 (M, K) row-major and b8_t (N, K) row-major, bf16 out."""
    return torch._scaled_mm(a8, b8_t.t(), scale_a=sa, scale_b=sb.t() if rowwise else sb,
                            out_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def _times_weight(a8: torch.Tensor, sa: torch.Tensor, w: torch.Tensor, rowwise: bool, fast_accum: bool
                  ) -> torch.Tensor:
    """a @ w.T, bf16 out, from a's FP8 copy and scales; w (N, K) is cast here (e4m3). For an input
    gradient g @ w pass w.t(): the contraction runs over w's output dim, so w's columns get the scales
    (a small cast: one weight matrix per micro-step)."""
    w8, sw = quantize(w, torch.float8_e4m3fn, rowwise)
    return _mm(a8, sa, w8, sw, rowwise, fast_accum)


def _weight_grad(grad_out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """grad_out^T @ x in bf16, in w's dtype: it contracts over the micro-batch's tokens (see above)."""
    return (grad_out.t() @ x.to(grad_out.dtype)).to(w.dtype)


class _FP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, rowwise: bool, fp8_grad_input: bool) -> torch.Tensor:
        x8, sx = quantize(x, torch.float8_e4m3fn, rowwise)
        ctx.save_for_backward(x, w)
        ctx.rowwise, ctx.fp8_grad_input = rowwise, fp8_grad_input
        return _times_weight(x8, sx, w, rowwise, fast_accum=True)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, w = ctx.saved_tensors
        rowwise = ctx.rowwise
        if ctx.fp8_grad_input:
            g8, sg = quantize(grad_out, torch.float8_e4m3fn if rowwise else torch.float8_e5m2, rowwise)
            grad_x = _times_weight(g8, sg, w.t(), rowwise, fast_accum=False)
        else:
            grad_x = grad_out @ w.to(grad_out.dtype)
        return grad_x.to(x.dtype), _weight_grad(grad_out, x, w), None, None


def fp8_linear_dynamic(x: torch.Tensor, w: torch.Tensor, scaling: str = "rowwise",
                       fp8_grad_input: bool = True) -> torch.Tensor:
    """x @ w.T (bf16 out) with FP8 operands scaled by their own absolute maxima; x of any leading
    shape, w (out, in) in any float dtype (the fp32 master weight is cast directly). The input
    gradient is an FP8 matmul too unless fp8_grad_input=False (then bf16: for outputs whose
    gradient's cast would not fuse into a one-pass kernel)."""
    if scaling not in SCALINGS:
        raise ValueError(f"fp8 scaling '{scaling}': use one of {', '.join(SCALINGS)}")
    lead = x.shape[:-1]
    out = _FP8Linear.apply(x.reshape(-1, x.shape[-1]), w, scaling == "rowwise", fp8_grad_input)
    return out.view(*lead, w.shape[0])


class _FP8ReLU2MLP(torch.autograd.Function):
    """proj(relu(fc(x))²) with row-wise FP8 matmuls, the activation and its casts in one kernel each
    way (model/kernels/relu2_fp8.py). Same math as two fp8_linear_dynamic calls around relu().square()."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        from .kernels.relu2_fp8 import relu2_fp8_fwd

        x8, sx = quantize(x, torch.float8_e4m3fn, True)
        h = _times_weight(x8, sx, w1, True, fast_accum=True)
        a, a8, sa = relu2_fp8_fwd(h)
        ctx.save_for_backward(x, w1, w2, h, a)
        return _times_weight(a8, sa, w2, True, fast_accum=True)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        from .kernels.relu2_fp8 import relu2_fp8_bwd

        x, w1, w2, h, a = ctx.saved_tensors
        g8, sg = quantize(grad_out, torch.float8_e4m3fn, True)
        grad_a = _times_weight(g8, sg, w2.t(), True, fast_accum=False)
        dh, dh8, sdh = relu2_fp8_bwd(grad_a, h)
        grad_x = _times_weight(dh8, sdh, w1.t(), True, fast_accum=False)
        return grad_x.to(x.dtype), _weight_grad(dh, x, w1), _weight_grad(grad_out, a, w2)


def fp8_relu2_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """relu(x @ w1.T)² @ w2.T (bf16 out) with row-wise FP8 operands; x of any leading shape."""
    lead = x.shape[:-1]
    out = _FP8ReLU2MLP.apply(x.reshape(-1, x.shape[-1]), w1, w2)
    return out.view(*lead, w2.shape[0])

