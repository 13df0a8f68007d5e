"""The FP8 head ops on CPU (torch._scaled_mm has a CPU path): accuracy against fp32 (and fp64 for the
fused head + loss), the backward,
and that compilation (fake kernels, autograd registration) reproduces eager results."""

import pytest
import torch
import torch.nn.functional as F

from speedgpt.model.fp8_head import E4M3_MAX, fp8_head_cross_entropy, fp8_linear

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


def ce_inputs(N=96, D=64, V=200, seed=0, ignore=True):
    g = torch.Generator().manual_seed(seed)
    x = F.rms_norm(torch.randn(N, D, generator=g), (D,)).bfloat16().requires_grad_()
    w = (torch.randn(V, D, generator=g) * 0.5).requires_grad_()  # logits up to ~±30: the cap matters
    t = torch.randint(0, V, (N,), generator=g)
    if ignore:
        t[7::11] = -100
    return x, w, t


def fp64_loss_and_grads(x, w, t, cap, reduction="mean"):
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    z = xr @ wr.T
    loss = F.cross_entropy(cap * torch.tanh(z / cap) if cap else z, t, reduction=reduction)
    loss.backward()
    return loss, xr.grad, wr.grad


@pytest.mark.parametrize("cap,reduction", [(15.0, "mean"), (0.0, "mean"), (15.0, "sum")])
def test_fp8_head_cross_entropy_matches_fp64(cap, reduction):
    """Loss from the FP8 logits, both gradients through the e5m2 logit gradient made in the forward."""
    x, w, t = ce_inputs()
    loss = fp8_head_cross_entropy(x, w, t, cap, 64 ** 0.5 / E4M3_MAX, 24 / E4M3_MAX, reduction)
    (loss * 3.0).backward()  # an upstream gradient other than 1 must reach both gradients
    ref, gx, gw = fp64_loss_and_grads(x, w, t, cap, reduction)
    assert abs(loss.item() - ref.item()) < 0.02 * abs(ref.item())  # e4m3 logits
    assert rel(x.grad, 3 * gx) < 0.1 and rel(w.grad, 3 * gw) < 0.1  # e5m2 gradient: ~5 %
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    ignored = t == -100
    assert ignored.any()


def test_fp8_head_cross_entropy_ignored_rows_get_no_gradient():
    x, w, t = ce_inputs()
    t[:] = -100
    t[:4] = 3
    fp8_head_cross_entropy(x, w, t, 15.0, 64 ** 0.5 / E4M3_MAX, 24 / E4M3_MAX).backward()
    assert x.grad[4:].abs().sum() == 0 and x.grad[:4].abs().sum() > 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fp8_head_cross_entropy_compiles_like_eager(backend):
    """Bit for bit: the casts and transposes that compilation takes over (Inductor generates their
    kernels) round as eager does, bf16 x included."""
    x, w, t = ce_inputs(seed=2)
    scales = (64 ** 0.5 / E4M3_MAX, 24 / E4M3_MAX)
    eager = fp8_head_cross_entropy(x, w, t, 15.0, *scales)
    (eager * 2.0).backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b: fp8_head_cross_entropy(a, b, t, 15.0, *scales), backend=backend,
                       fullgraph=True)
    compiled = fn(x, w)
    (compiled * 2.0).backward()
    assert torch.equal(eager, compiled) and torch.equal(gx, x.grad) and torch.equal(gw, w.grad)


def test_fp8_head_custom_ops_take_fp8_operands():
    """The casts to e4m3 and the operands' transposes are in the compiled graphs, not in the opaque ops
    (where they ran as slow eager kernels): the ops receive e4m3 tensors in the layouts they use."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    x, w, t = ce_inputs(N=96, D=64, V=200)
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b: fp8_head_cross_entropy(a, b, t, 15.0, 64 ** 0.5 / E4M3_MAX, 24 / E4M3_MAX),
                       backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    fn(x, w).backward()
    calls = {n.target: [a.meta["val"] for a in n.args[:4] if isinstance(a, torch.fx.Node)]
             for gm in graphs for n in gm.graph.nodes
             if n.target in (torch.ops.speedgpt.fp8_head_ce_fwd.default, torch.ops.speedgpt.fp8_head_ce_bwd.default)}
    x8, w8, _ = calls[torch.ops.speedgpt.fp8_head_ce_fwd.default]
    assert (x8.dtype, x8.shape, w8.dtype, w8.shape) == (torch.float8_e4m3fn, (96, 64), torch.float8_e4m3fn, (200, 64))
    g8, g8t, x8t, w8t = calls[torch.ops.speedgpt.fp8_head_ce_bwd.default]
    assert (g8.shape, g8t.shape) == ((96, 200), (200, 96)) and g8.dtype == g8t.dtype == torch.float8_e5m2
    assert x8t.dtype == w8t.dtype == torch.float8_e4m3fn and x8t.shape == (64, 96) and w8t.shape == (64, 200)
    assert x8t.is_contiguous() and w8t.is_contiguous()


def test_model_fused_fp8_head_trains_like_the_bf16_free_head():
    """The model's training path through the fused op against the same model with a plain fp32 head:
    the loss and every matrix's gradient (the fused op's e5m2 logit gradient feeds all of them)."""
    from speedgpt.config import ModelConfig
    from speedgpt.model.build import build_model
    from speedgpt.model.runtime import runtime_for

    cfg = ModelConfig(depth=2, model_dim=64, head_dim=32, vocab_size=300, value_embeds=1, logit_softcap=15.0)
    runtime = runtime_for(cfg, "cpu")
    bf16_head = build_model(cfg, 64, runtime, seed=0)
    with torch.no_grad():
        bf16_head.lm_head.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))  # not the global RNG
    fused_head = build_model(cfg, 64, runtime.replace(fp8_head=True, fused_ce=True), seed=0)  # forced on CPU
    fused_head.load_state_dict(bf16_head.state_dict())
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 300, (2, 64), generator=g)
    y = torch.randint(0, 300, (2, 64), generator=g)
    runs = []
    for m in (bf16_head, fused_head):
        m.zero_grad()
        loss = m(x, y)
        loss.backward()
        # scalars (lambdas) excluded: sums of few, cancelling terms, their relative error says little
        runs.append((loss.item(), {n: p.grad.clone() for n, p in m.named_parameters()
                                   if p.ndim >= 2 and "lambdas" not in n}))
    (l_ref, g_ref), (l_fused, g_fused) = runs
    assert abs(l_ref - l_fused) < 0.01 * l_ref  # e4m3 logits
    assert g_ref.keys() == g_fused.keys() and "lm_head.weight" in g_ref
    errors = {n: rel(g_fused[n], g_ref[n]) for n in g_ref if g_ref[n].norm() > 0}
    assert len(errors) >= 5 and max(errors.values()) < 0.1, errors  # e5m2: ~4 %
    with torch.no_grad():
        assert torch.isfinite(m(x, y)) and m(x).shape == (2, 64, 384)  # no-grad and no-target paths
