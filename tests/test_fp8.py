"""The FP8 head ops on CPU (torch._scaled_mm has a CPU path): accuracy against fp32, the backward,
and that compilation (fake kernels, autograd registration) reproduces eager results."""

import pytest
import torch
import torch.nn.functional as F

from speedgpt.model.fp8 import E4M3_MAX, fp8_linear

pytestmark = pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 dtypes in this torch")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def inputs(N=128, D=64, V=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = F.rms_norm(torch.randn(N, D, generator=g), (D,)).bfloat16().requires_grad_()
    w = (torch.randn(V, D, generator=g) * 0.05).requires_grad_()
    gout = torch.randn(N, V, generator=g) / N
    return x, w, gout, (D ** 0.5 / E4M3_MAX, 24 / E4M3_MAX, 1 / (N * E4M3_MAX))


def test_fp8_linear_close_to_fp32_forward_and_backward():
    x, w, gout, scales = inputs()
    out = fp8_linear(x, w, *scales)
    assert out.dtype == torch.bfloat16 and out.shape == (128, 96)
    out.backward(gout.bfloat16())
    xr, wr = x.detach().float().requires_grad_(), w.detach().clone().requires_grad_()
    ref = xr @ wr.T
    ref.backward(gout)
    assert rel(out, ref) < 0.06  # e4m3 operands: ~2-4 % relative error
    assert rel(x.grad, xr.grad) < 0.1 and rel(w.grad, wr.grad) < 0.1  # e5m2 gradient: ~6 %
    assert w.grad.dtype == torch.float32 and w.grad.is_contiguous()


def test_fp8_scales_hold_the_extremes():
    """A unit-RMS row with all its mass in one coordinate reaches |x| = sqrt(dim): still finite."""
    D = 64
    x = torch.zeros(16, D)
    x[:, 3] = D ** 0.5
    x = x.bfloat16().requires_grad_()
    w = torch.randn(32, D) * 0.05
    out = fp8_linear(x, w.requires_grad_(), D ** 0.5 / E4M3_MAX, 24 / E4M3_MAX, 1 / (16 * E4M3_MAX))
    assert torch.isfinite(out).all()
    assert rel(out, x.float() @ w.T) < 0.06


def test_fp8_linear_compiles_like_eager():
    x, w, gout, scales = inputs(seed=1)
    eager = fp8_linear(x, w, *scales)
    eager.backward(gout.bfloat16())
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    compiled = torch.compile(lambda a, b: fp8_linear(a, b, *scales), backend="aot_eager", fullgraph=True)(x, w)
    compiled.backward(gout.bfloat16())
    assert torch.equal(eager, compiled) and torch.equal(gx, x.grad) and torch.equal(gw, w.grad)
