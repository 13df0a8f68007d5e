"""Fused softcapped cross-entropy over the lm_head logits (Triton forward + backward).

    loss_i = logsumexp_j(z_ij) - z_i,t_i,   z = cap * tanh(x / cap)   (cap = 0: z = x)

The unfused torch code materializes the fp32 logits, the capped logits and the softmax (several
passes over a 49152 x 50304 fp32 tensor per micro-step). Here:

- forward: one read of the (bf16) logits per row; capped logits computed in fp32 in registers;
  writes the per-row loss and logsumexp (fp32, 4 bytes per row each). Nothing else is saved.
- backward: one read of the logits + one write of the gradient in the logits' dtype,
  recomputing z from x and using the saved logsumexp:
      dL/dx_ij = g_i * (softmax_ij - [j == t_i]) * (1 - tanh^2(x_ij / cap))
  With `inplace_backward=True` the gradient is written into the logits' own buffer (saves a
  (rows x vocab) allocation: 4.9 GB at the speedrun shape). Only do this when nothing else reads
  the logits after the loss: the op saves the logits for its backward and overwrites them there.
  In eager mode autograd's version counter catches a second reader that saved them; a caller that
  merely keeps a Python reference sees the gradient afterwards.

The log-sum-exp needs no running max when the cap is small: capped logits lie in [-cap, cap],
so exp(z - cap) lies in [exp(-2 cap), 1] and the sum of V such terms neither overflows nor
underflows in fp32 for cap <= 40. Larger caps (and cap = 0) use an online max per chunk.

tanh(y) = 1 - 2 / (exp(2y) + 1): one exp2 and one fast division in fp32; its absolute error
(~1e-7, times cap for z) is what matters for a softmax. libdevice's tanhf is selectable
(CONFIG["tanh"]) on the GPU; the Triton interpreter has no libdevice.

Reductions follow F.cross_entropy: "mean" divides by the number of targets != ignore_index
(NaN when all are ignored, as torch), "sum", "none" (ignored rows get 0). Targets must lie in
[0, V) or equal ignore_index; others are not checked (the loss of such a row is its logsumexp).

Two generalizations, each a constexpr of the kernels, so that the plain case (one target, no map)
compiles to the same instructions as before they existed:
- an affine pre-map of the logits, z = cap * tanh((a x + b) / cap), for record #54's rescale (model/
  gates.py); the gradient gains the factor a, folded into each row's scale.
- multi-token prediction (model/mtp.py): K targets per row (ignore_index: past the row's end) with K
  weights read from a device tensor (new values, no recompile). Row i's loss is sum_k w_k (lse_i -
  z_i,t_ik) over its valid targets: one logsumexp serves all K, so the forward still reads the logits
  once, and so does the backward: dloss_i/dz_ij = Wv_i softmax_ij - sum_k w_k [j == t_ik], Wv_i the
  sum of row i's valid weights. "mean" then divides by the rows, as multi_token_loss divides by B*T.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# CONFIG (the launch parameters), HAVE_TRITON, available and interpreting are part of this module's
# interface (scripts/gpu_check*.py, benchmarks/ce_grad.py and the tests use them from here).
from .softcap_ce_launch import CONFIG, _triton_bwd, _triton_fp8_grad, _triton_fwd
from .triton_support import HAVE_TRITON, available, interpreting


# --------------------------------------------------------------------------------------------
# Pure-torch reference (CPU fallback and test oracle)
# --------------------------------------------------------------------------------------------

def mapped(logits: torch.Tensor, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """The logits in fp32 after the affine pre-map scale * x + shift (none for 1, 0)."""
    y = logits.float()
    return y * scale + shift if scale != 1.0 or shift != 0.0 else y


def capped(logits: torch.Tensor, cap: float, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    z = mapped(logits, scale, shift)
    return cap * torch.tanh(z / cap) if cap else z


def reference_rows(logits, targets, cap: float, ignore_index: int = -100, weights=None, scale: float = 1.0,
                   shift: float = 0.0):
    """Per-row (loss, logsumexp) in fp32, the forward op's contract, in plain torch. With `weights` (K),
    targets (N, K): row i's loss is sum_k w_k * (lse_i - z_i,t_ik) over its valid targets."""
    z = capped(logits, cap, scale, shift)
    lse = torch.logsumexp(z, dim=-1)
    if weights is not None:
        t = targets.reshape(z.shape[0], -1)
        valid = t != ignore_index
        ce = torch.where(valid, lse.unsqueeze(1) - z.gather(1, torch.where(valid, t, 0).long()), 0.0)
        return (ce * weights.reshape(1, -1).float()).sum(1), lse
    valid = targets != ignore_index
    zt = z.gather(1, torch.where(valid, targets, 0).long().unsqueeze(1)).squeeze(1)
    return torch.where(valid, lse - zt, 0.0), lse


def reference_grad(logits, targets, lse, dloss, cap: float, ignore_index: int = -100, weights=None,
                   scale: float = 1.0, shift: float = 0.0):
    """dL/dlogits for per-row upstream gradients `dloss`, in the logits' dtype (weights: as reference_rows)."""
    z = capped(logits, cap, scale, shift)
    if weights is not None:
        t = targets.reshape(z.shape[0], -1)
        w = torch.where(t != ignore_index, weights.reshape(1, -1).float(), 0.0)
        d = torch.exp(z - lse.unsqueeze(1)) * w.sum(1, keepdim=True)
        d.scatter_add_(1, torch.where(t != ignore_index, t, 0).long(), -w)
        row_scale = dloss.float()
    else:
        valid = targets != ignore_index
        d = torch.exp(z - lse.unsqueeze(1))
        d.scatter_add_(1, torch.where(valid, targets, 0).long().unsqueeze(1),
                       -valid.float().unsqueeze(1))
        row_scale = torch.where(valid, dloss.float(), 0.0)
    if cap:
        d = d * (1 - torch.tanh(mapped(logits, scale, shift) / cap).square())
    if scale != 1.0:
        row_scale = row_scale * scale
    return (d * row_scale.unsqueeze(1)).to(logits.dtype)


def _check_targets(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None):
    """(targets contiguous, weights as K contiguous fp32 values or None) for N rows of logits: targets (N,)
    without weights, (N, K) or (N,) for K = 1 with them."""
    n, k = logits.shape[0], 1 if weights is None else weights.numel()
    if weights is not None and (weights.dim() > 1 or k == 0):
        raise ValueError(f"weights must be a 0-d or 1-d tensor of K >= 1 values, got shape {tuple(weights.shape)}")
    if targets.dim() not in (1, 2) or targets.shape[0] != n or targets.numel() != n * k or \
            (weights is None and targets.dim() != 1):
        raise ValueError(f"targets {tuple(targets.shape)} do not match logits {tuple(logits.shape)}"
                         + ("" if weights is None else f" and {k} weights"))
    return targets.contiguous(), None if weights is None else weights.reshape(-1).float().contiguous()


def softcap_ce_fp8_grad(logits: torch.Tensor, targets: torch.Tensor, cap: float, g_scale: float,
                        ignore_index: int = -100, fp8_dtype: torch.dtype = torch.float8_e5m2, *,
                        weights: torch.Tensor | None = None, scale: float = 1.0, shift: float = 0.0):
    """(per-row loss fp32, G, G^T contiguous) with G = g_scale * dloss_i/dlogits_ij in `fp8_dtype`:
    the loss and its unreduced gradient together, for a caller that knows the gradient is needed
    (the FP8 head, model/fp8_head.py): the forward kernel (loss, logsumexp), then one gradient kernel that
    reads the logits once and writes both fp8 layouts. Ignored rows get loss 0 and a zero gradient row.
    weights, scale, shift: as softcap_cross_entropy. The GPU's f16 kernel needs |G| <= 2^15, i.e.
    g_scale * |scale| * (sum of the weights) <= 2^15 (not checked: the weights live on the device).
    Triton where available, plain torch elsewhere (same contract)."""
    targets, weights = _check_targets(logits, targets, weights)
    if available(logits.device):
        return _triton_fp8_grad(logits, targets, cap, g_scale, ignore_index, fp8_dtype, weights, scale, shift)
    loss, lse = reference_rows(logits, targets, cap, ignore_index, weights, scale, shift)
    g = reference_grad(logits.float(), targets, lse, torch.full_like(lse, g_scale), cap, ignore_index, weights,
                       scale, shift)
    g8 = g.to(fp8_dtype)
    return loss, g8, g8.T.contiguous()


def softcap_cross_entropy_reference(logits, targets, cap: float, reduction: str = "mean",
                                    ignore_index: int = -100):
    """What the model computes without the kernel: fp32 softcap then F.cross_entropy."""
    return F.cross_entropy(capped(logits, cap), targets.long(), reduction=reduction, ignore_index=ignore_index)


# --------------------------------------------------------------------------------------------
# Custom ops (compose with torch.compile: fake kernels + autograd registration)
# --------------------------------------------------------------------------------------------

def _use_triton(t: torch.Tensor) -> bool:
    return available(t.device)


@torch.library.custom_op("speedgpt::softcap_ce_fwd", mutates_args=())
def softcap_ce_fwd(logits: torch.Tensor, targets: torch.Tensor, cap: float, ignore_index: int,
                   inplace_backward: bool, weights: Optional[torch.Tensor] = None, scale: float = 1.0,
                   shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row loss, per-row logsumexp), fp32. inplace_backward only tells the backward what to do."""
    if _use_triton(logits):
        return _triton_fwd(logits, targets, cap, ignore_index, weights, scale, shift)
    return reference_rows(logits, targets, cap, ignore_index, weights, scale, shift)


@softcap_ce_fwd.register_fake
def _(logits, targets, cap, ignore_index, inplace_backward, weights=None, scale=1.0, shift=0.0):
    n = logits.shape[0]
    return logits.new_empty(n, dtype=torch.float32), logits.new_empty(n, dtype=torch.float32)


@torch.library.custom_op("speedgpt::softcap_ce_bwd", mutates_args=())
def softcap_ce_bwd(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
                   cap: float, ignore_index: int, weights: Optional[torch.Tensor] = None, scale: float = 1.0,
                   shift: float = 0.0) -> torch.Tensor:
    """Gradient w.r.t. the logits, in a new tensor of the logits' dtype."""
    if _use_triton(logits):
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        return _triton_bwd(logits, targets, lse, dloss, cap, ignore_index, out, weights, scale, shift)
    return reference_grad(logits, targets, lse, dloss, cap, ignore_index, weights, scale, shift)


@softcap_ce_bwd.register_fake
def _(logits, targets, lse, dloss, cap, ignore_index, weights=None, scale=1.0, shift=0.0):
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


@torch.library.custom_op("speedgpt::softcap_ce_bwd_", mutates_args=("logits",))
def softcap_ce_bwd_(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
                    cap: float, ignore_index: int, weights: Optional[torch.Tensor] = None, scale: float = 1.0,
                    shift: float = 0.0) -> None:
    """Gradient w.r.t. the logits, written over the logits."""
    if _use_triton(logits) and logits.stride(-1) == 1:
        _triton_bwd(logits, targets, lse, dloss, cap, ignore_index, logits, weights, scale, shift)
    else:
        logits.copy_(reference_grad(logits, targets, lse, dloss, cap, ignore_index, weights, scale, shift))


@softcap_ce_bwd_.register_fake
def _(logits, targets, lse, dloss, cap, ignore_index, weights=None, scale=1.0, shift=0.0):
    return None


def _setup_context(ctx, inputs, output):
    logits, targets, cap, ignore_index, inplace_backward, weights, scale, shift = inputs
    _, lse = output
    ctx.save_for_backward(logits, targets, lse, weights)
    ctx.args = (cap, ignore_index, weights is not None, scale, shift)
    ctx.inplace = inplace_backward
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dloss, _dlse):
    logits, targets, lse, weights = ctx.saved_tensors
    cap, ignore_index, has_weights, scale, shift = ctx.args
    weights = weights if has_weights else None
    if ctx.inplace:
        softcap_ce_bwd_(logits, targets, lse, dloss, cap, ignore_index, weights, scale, shift)
        grad = logits
    else:
        grad = softcap_ce_bwd(logits, targets, lse, dloss, cap, ignore_index, weights, scale, shift)
    return grad, None, None, None, None, None, None, None


softcap_ce_fwd.register_autograd(_backward, setup_context=_setup_context)


def softcap_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, cap: float, reduction: str = "mean",
                          ignore_index: int = -100, inplace_backward: bool = False, *,
                          weights: torch.Tensor | None = None, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    """F.cross_entropy(cap * tanh(logits.float() / cap), targets) without materializing fp32 logits.

    logits: (N, V), any float dtype (bf16 from the lm_head); last dim contiguous preferred.
    targets: (N,) integer class ids in [0, V) or ignore_index. cap: softcap (0 disables it).
    reduction: "mean" (over non-ignored rows) | "sum" | "none" (fp32 per-row losses, shape (N,)).
    inplace_backward: the backward writes dL/dlogits into the logits' storage (see module docstring).
    scale, shift: the logits' affine pre-map, z = cap * tanh((scale * x + shift) / cap) (record #54's rescale,
    model/gates.py); 1, 0: none.
    weights: multi-token prediction (model/mtp.py): K weights (a device tensor, so new values do not
    recompile) for targets (N, K), ignore_index marking a target past the row's end: row i's loss is
    sum_k w_k * CE(z_i, t_ik) over its valid targets, and "mean" divides their sum by N, the rows
    (multi_token_loss's B * T), not by the valid targets.
    Triton on CUDA (and on CPU under TRITON_INTERPRET=1); plain torch elsewhere."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be mean, sum or none, not {reduction!r}")
    targets, weights = _check_targets(logits, targets, weights)  # the kernels index targets[row * K + k]
    loss, _ = softcap_ce_fwd(logits, targets, float(cap), int(ignore_index), bool(inplace_backward), weights,
                             float(scale), float(shift))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if weights is not None:
        return loss.sum() / loss.shape[0]
    return loss.sum() / (targets != ignore_index).sum()


__all__ = ["softcap_cross_entropy", "softcap_ce_fp8_grad", "softcap_cross_entropy_reference", "reference_rows", "reference_grad",
           "available", "interpreting", "CONFIG", "HAVE_TRITON"]
