"""The FP8 MLP's fused activation (model/kernels/relu2_fp8.py, fp8_linear.fp8_relu2_mlp): the torch
reference against fp8_cast's quantize, the Triton kernels against the reference (under
TRITON_INTERPRET on CPU, or on a GPU), the whole MLP against the unfused FP8 path, compile, and
the wiring in build_model."""

import pytest
import torch
import torch.nn.functional as F

from speedgpt.model import mlp as mlp_module
from speedgpt.model import runtime as runtime_module
from speedgpt.model.build import build_model
from speedgpt.model.fp8_cast import quantize
from speedgpt.model.fp8_linear import fp8_linear_dynamic, fp8_relu2_mlp
from speedgpt.model.kernels import relu2_fp8 as k
from speedgpt.model.kernels.softcap_ce import interpreting
from test_fp8 import rel
from test_fp8_linear import needs_rowwise
from test_model import tiny_model_cfg

pytestmark = pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 dtypes in this torch")
E4M3 = getattr(torch, "float8_e4m3fn", None)


def rows(n=37, cols=96, seed=0, device="cpu"):
    """bf16 rows of mixed sign over several magnitudes, one all-negative row (ReLU zeroes it)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, cols, generator=g) * (10.0 ** torch.linspace(-2, 2, n))[:, None]
    t[n // 2] = -t[n // 2].abs() - 0.1
    return t.bfloat16().to(device)


def test_reference_is_quantize_of_relu_squared():
    h = rows()
    a, a8, scale = k.relu2_fp8_fwd_reference(h)
    assert torch.equal(a, F.relu(h).square())
    q, s = quantize(a, E4M3, rowwise=True)
    assert torch.equal(a8.view(torch.uint8), q.view(torch.uint8)) and torch.equal(scale, s)
    assert (a[len(h) // 2] == 0).all() and torch.isfinite(scale).all()
    g = rows(seed=1)
    dh, dh8, sdh = k.relu2_fp8_bwd_reference(g, h)
    assert torch.equal(dh, (g.float() * 2 * F.relu(h.float())).bfloat16())
    q, s = quantize(dh, E4M3, rowwise=True)
    assert torch.equal(dh8.view(torch.uint8), q.view(torch.uint8)) and torch.equal(sdh, s)


def _kernel_device():
    if torch.cuda.is_available():
        return "cuda"
    if k.available("cpu"):
        return "cpu"  # the Triton interpreter
    pytest.skip("no triton here (GPU, or CPU with TRITON_INTERPRET=1)")


@pytest.mark.parametrize("shape", [(37, 96), (8, 3072), (5, 40)])
def test_triton_kernels_match_the_reference(shape):
    device = _kernel_device()
    h, g = rows(*shape, device=device), rows(*shape, seed=3, device=device)
    assert k._use_triton(h)
    for got, want in ((k.relu2_fp8_fwd(h), k.relu2_fp8_fwd_reference(h)),
                      (k.relu2_fp8_bwd(g, h), k.relu2_fp8_bwd_reference(g, h))):
        out, out8, scale = got
        assert out.dtype == torch.bfloat16 and out8.dtype == E4M3 and scale.shape == (shape[0], 1)
        if interpreting():
            # the interpreter's float casts truncate where the GPU's round to nearest: one step apart
            torch.testing.assert_close(out, want[0], rtol=2 ** -7, atol=0)
            torch.testing.assert_close(scale, want[2], rtol=2 ** -7, atol=0)
            continue
        assert torch.equal(out, want[0])
        torch.testing.assert_close(scale, want[2], rtol=1e-6, atol=0)
        # the division may round differently in the last bit: at most one e4m3 step apart
        diff = (out8.float() - want[1].float()).abs()
        assert (diff <= want[1].float().abs() * 2 ** -3 + 2 ** -9).all()
        assert (out8.float() == want[1].float()).float().mean() > 0.99


def mlp_weights(D=64, H=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(H, D, generator=g) * D ** -0.5).requires_grad_()
    w2 = (torch.randn(D, H, generator=g) * 0.05).requires_grad_()
    x = F.rms_norm(torch.randn(3, 10, D, generator=g), (D,)).bfloat16().requires_grad_()
    return x, w1, w2


def run(fn, x, w1, w2, gout):
    for t in (x, w1, w2):
        t.grad = None
    out = fn(x, w1, w2)
    out.backward(gout)
    return out.detach(), x.grad.clone(), w1.grad.clone(), w2.grad.clone()


@needs_rowwise
def test_fused_mlp_matches_the_unfused_fp8_path():
    x, w1, w2 = mlp_weights()
    gout = torch.randn(3, 10, 64, generator=torch.Generator().manual_seed(9)).bfloat16()
    fused = run(fp8_relu2_mlp, x, w1, w2, gout)
    unfused = run(lambda a, b, c: fp8_linear_dynamic(F.relu(fp8_linear_dynamic(a, b)).square(), c), x, w1, w2, gout)
    if interpreting():  # its casts truncate (see above): only the wiring is checked here
        assert rel(fused[0], unfused[0]) < 0.15
    else:
        assert torch.equal(fused[0], unfused[0])  # same casts, same matmuls
    assert fused[2].dtype == fused[3].dtype == torch.float32 and fused[1].dtype == torch.bfloat16
    for a, b in zip(fused[1:], unfused[1:]):
        # the unfused eager backward rounds g * 2 relu(h) to bf16 twice, the kernel once
        assert rel(a, b) < (0.15 if interpreting() else 0.02)
    ref = run(lambda a, b, c: F.linear(F.relu(F.linear(a.float(), b)).square(), c), x, w1, w2, gout.float())
    for a, b in zip(fused, ref):
        assert 1e-3 < rel(a, b) < 0.1  # FP8 error, and the FP8 path really ran


@needs_rowwise
def test_fused_mlp_compiles_like_eager():
    x, w1, w2 = mlp_weights(seed=2)
    gout = torch.randn(3, 10, 64, generator=torch.Generator().manual_seed(5)).bfloat16()
    eager = run(fp8_relu2_mlp, x, w1, w2, gout)
    compiled = run(torch.compile(fp8_relu2_mlp, backend="aot_eager", fullgraph=True), x, w1, w2, gout)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_build_model_fuses_the_activation_of_rowwise_fp8_mlps(monkeypatch):
    monkeypatch.setattr(runtime_module, "fp8_supported", lambda device: True)
    m = build_model(tiny_model_cfg("--model.fp8_mlp=true"), 32, "cpu", seed=0)
    assert all(b.mlp.fused_act and b.mlp.fp8_scaling == "rowwise" for b in m.blocks)
    m = build_model(tiny_model_cfg("--model.fp8_mlp=true", "--model.fp8_mlp_fused_act=false"), 32, "cpu", seed=0)
    assert not any(b.mlp.fused_act for b in m.blocks)


@needs_rowwise
def test_mlp_module_takes_the_fused_path(monkeypatch):
    calls = []
    monkeypatch.setattr(mlp_module, "fp8_relu2_mlp", lambda *a: calls.append(a) or fp8_relu2_mlp(*a))
    x = mlp_weights()[0].detach()

    def mlp(**kw):
        m = mlp_module.MLP(64, 256, **kw)
        m.init_weights()
        return m

    mlp(fp8_scaling="rowwise")(x)
    assert not calls  # fused_act is off unless asked for
    mlp(fp8_scaling="rowwise", fused_act=True)(x)
    assert len(calls) == 1
    fused = mlp(fp8_scaling="tensorwise", fused_act=True)  # the kernel casts row-wise only
    fused(x)
    assert len(calls) == 1 and not fused.fused_act
