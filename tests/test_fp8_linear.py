"""The dynamic-scale FP8 linear (model/fp8_linear.py) on CPU (torch._scaled_mm has a CPU path for
tensorwise and rowwise scales): quantization exactness, forward/backward accuracy against fp32, that
the FP8 path is really taken, the zero-weight start of the MLP projection, the MLP wiring in
build_model, and the config check of fp8_scaling."""

import pytest
import torch
import torch.nn.functional as F

from speedgpt.config import ConfigError, apply_overrides, load_preset
from speedgpt.model import runtime as runtime_module
from speedgpt.model.build import build_model
from speedgpt.model.fp8_cast import E4M3_MAX, E5M2_MAX, quantize
from speedgpt.model.fp8_linear import fp8_linear_dynamic
from speedgpt.model.mlp import MLP
from speedgpt.plan import validate
from test_fp8 import rel  # relative error in the Frobenius norm
from test_model import batch, tiny_model_cfg  # a depth-4, width-64 model and BOS-split token rows

pytestmark = pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no float8 dtypes in this torch")

E4M3, E5M2 = (torch.float8_e4m3fn, torch.float8_e5m2) if hasattr(torch, "float8_e4m3fn") else (None, None)
# per format: max, relative rounding bound of a normal (half an ulp: 2^-(mantissa bits + 1)), and half the
# subnormal spacing (the absolute error floor, in units of the scale)
FORMATS = {"e4m3": (E4M3, E4M3_MAX, 2.0 ** -4, 2.0 ** -10), "e5m2": (E5M2, E5M2_MAX, 2.0 ** -3, 2.0 ** -17)}


needs_rowwise = pytest.mark.skipif(not runtime_module.cpu_runs_rowwise_fp8(),
                                   reason="this torch's CPU _scaled_mm is per-tensor only")
SCALINGS = [pytest.param("rowwise", marks=needs_rowwise), "tensorwise"]


def ranged_rows(rows=48, cols=80, seed=0):
    """Rows whose magnitudes span 10^-3 .. 10^3 (so a per-tensor scale pushes small rows into subnormals),
    one all-zero row, and fp32 values (no pre-rounding)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, generator=g) * (10.0 ** torch.linspace(-3, 3, rows))[:, None]
    t[rows // 3] = 0.0
    return t


# -- quantize -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "tensorwise"])
def test_quantize_scale_shape_rounding_and_amax(fmt, rowwise):
    dtype, fmax, rel_bound, sub_floor = FORMATS[fmt]
    t = ranged_rows()
    q, scale = quantize(t, dtype, rowwise)
    assert q.dtype == dtype and q.shape == t.shape and q.is_contiguous()
    assert scale.dtype == torch.float32
    assert scale.shape == ((t.shape[0], 1) if rowwise else ())
    amax = t.abs().amax(dim=-1, keepdim=True) if rowwise else t.abs().amax()
    nonzero = amax > 0
    # scale = amax / fmax exactly where amax > 0 (the zero row's tiny scale is checked below)
    assert torch.equal(torch.where(nonzero, scale, 0.0), torch.where(nonzero, amax / fmax, 0.0))
    qf = q.float()
    assert torch.isfinite(qf).all() and torch.isfinite(scale).all()
    # dequantized within the format's rounding: relative for normals, absolute floor for subnormals
    deq = qf * scale
    bound = rel_bound * t.abs() * (1 + 2.0 ** -20) + sub_floor * scale.expand_as(t)
    err = (deq - t).abs()
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item():.3e}"
    # the absolute max of every non-zero row (tensor) lands exactly on the format max, with its sign
    if rowwise:
        rows = nonzero.squeeze(1)
        assert torch.equal(qf.abs().amax(dim=-1)[rows], torch.full((int(rows.sum()),), fmax))
        idx = t.abs().argmax(dim=-1)
        at_max = qf.gather(1, idx[:, None]).squeeze(1)[rows]
        assert torch.equal(at_max, fmax * t.gather(1, idx[:, None]).squeeze(1)[rows].sign())
    else:
        assert qf.abs().max().item() == fmax
        assert qf.flatten()[t.abs().argmax()].item() == fmax * t.flatten()[t.abs().argmax()].sign().item()
    # the all-zero row stays exactly zero, no NaN from 0 / tiny scale
    zero_row = t.shape[0] // 3
    assert torch.equal(qf[zero_row], torch.zeros(t.shape[1]))
    if rowwise:
        assert 0 < scale[zero_row].item() < 1e-20


@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "tensorwise"])
def test_quantize_all_zero_tensor_stays_zero(rowwise):
    for dtype in (E4M3, E5M2):
        q, scale = quantize(torch.zeros(8, 16, dtype=torch.bfloat16), dtype, rowwise)
        assert torch.equal(q.float(), torch.zeros(8, 16))
        assert torch.isfinite(scale).all() and (scale > 0).all()
        assert torch.equal((q.float() * scale), torch.zeros(8, 16))


@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "tensorwise"])
def test_quantize_of_transposed_view_is_row_major(rowwise):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 24, generator=g) * 0.05
    wt = w.t()
    assert not wt.is_contiguous()
    q, scale = quantize(wt, E4M3, rowwise)
    assert q.shape == (24, 40) and q.is_contiguous() and q.stride() == (40, 1)
    q_ref, scale_ref = quantize(wt.contiguous(), E4M3, rowwise)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(scale, scale_ref)
    if rowwise:  # rows of w.t() are columns of w: one scale per input unit
        assert scale.shape == (24, 1)
        assert torch.equal(scale, w.abs().amax(dim=0)[:, None] / E4M3_MAX)


MAGNITUDES = (1.0, 1e-30, 1e-20, 1e20, 1e30)  # rows' scales, across float32's range


def overshooting_rows(fmax: float, n: int) -> list[torch.Tensor]:
    """Per magnitude, n rows [v, -v/2, v/4] whose v / (v / fmax) comes out above fmax (the division's rounding),
    asserted found so that the case is really exercised."""
    v = torch.linspace(1.0, 3.0, 20001)
    over = v[v / (v / fmax) > fmax][:n]
    assert over.numel() == n
    return [torch.stack([over, -0.5 * over, 0.25 * over], dim=1) * m for m in MAGNITUDES]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_max_rounding_up_in_division_gives_no_nan(fmt):
    """amax / (amax / fmax) can come out one fp32 ulp above fmax; the result must stay finite and equal
    fmax. (On CPU the cast itself also maps such overshoots to fmax, so this guards the outcome rather
    than the clamp itself.)"""
    dtype, fmax, _, _ = FORMATS[fmt]
    for t in overshooting_rows(fmax, 32):
        for rowwise in (True, False):
            q, scale = quantize(t, dtype, rowwise)
            qf = q.float()
            assert torch.isfinite(qf).all() and torch.isfinite(scale).all()
            if rowwise:
                assert torch.equal(qf[:, 0], torch.full((32,), fmax))
            else:
                assert qf.abs().max().item() == fmax
    # bf16 input at the extremes of its range (same exponent range as fp32)
    for big in (3e38, 1e-25):
        t = torch.tensor([[big, -big / 3, 0.0]], dtype=torch.bfloat16)
        q, scale = quantize(t, dtype, True)
        assert torch.isfinite(q.float()).all() and q.float()[0, 0].item() == fmax


def clamped_quantize(t, dtype, rowwise):
    """quantize as it was before its clamp went (the reference the cast without one must equal)."""
    fmax = E4M3_MAX if dtype == torch.float8_e4m3fn else E5M2_MAX
    t32 = t.float()
    amax = t32.abs().amax(dim=-1, keepdim=True) if rowwise else t32.abs().amax()
    scale = amax.clamp_min(1e-30) / fmax
    return (t32 / scale).clamp(-fmax, fmax).to(dtype), scale


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_without_a_clamp_equals_the_clamped_cast_bit_for_bit(fmt):
    """The cast after the division takes no clamp (fp8_cast.quantize): its rounding already maps the division's
    overshoot of fmax to fmax. Eager and compiled (Inductor's own cast), on rows built to overshoot, rows of
    every magnitude, zero rows and random ones: the same bits as the clamped cast."""
    dtype, fmax, _, _ = FORMATS[fmt]
    g = torch.Generator().manual_seed(0)
    rows = overshooting_rows(fmax, 64) + [torch.zeros(64, 3), torch.randn(64, 3, generator=g) * 1e3]
    t = torch.cat(rows)
    compiled = torch.compile(quantize, backend="inductor", fullgraph=True)
    for rowwise in (True, False):
        ref_q, ref_scale = clamped_quantize(t, dtype, rowwise)
        for name, fn in (("eager", quantize), ("compiled", compiled)):
            q, scale = fn(t, dtype, rowwise)
            assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)), (name, rowwise)
            assert torch.equal(scale, ref_scale), (name, rowwise)
    torch._dynamo.reset()


# -- fp8_linear_dynamic ----------------------------------------------------------------------------------

def linear_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = F.rms_norm(torch.randn(4, 16, 96, generator=g), (96,)).bfloat16()
    w = torch.randn(128, 96, generator=g) * 0.05
    gout = torch.randn(4, 16, 128, generator=g).bfloat16()
    return x, w, gout


@pytest.mark.parametrize("scaling", SCALINGS)
def test_fp8_linear_dynamic_close_to_fp32_forward_and_backward(scaling):
    x0, w0, gout = linear_inputs()
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    out = fp8_linear_dynamic(x, w, scaling)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 16, 128)
    out.backward(gout)
    assert x.grad.dtype == torch.bfloat16 and x.grad.shape == (4, 16, 96)
    assert w.grad.dtype == torch.float32 and w.grad.shape == (128, 96)

    xr, wr = x0.float().requires_grad_(), w0.clone().requires_grad_()
    ref = F.linear(xr, wr)
    ref.backward(gout.float())
    assert rel(out, ref) < 0.06  # measured ~0.037 (e4m3: 3 mantissa bits on both operands)
    assert rel(x.grad, xr.grad) < 0.1  # measured ~0.037 rowwise, ~0.059 tensorwise (e5m2 gradient)
    assert rel(w.grad, wr.grad) < 0.01  # bf16 matmul, measured ~0.0017

    # the FP8 path is really taken: a bf16 matmul lands ~0.002 from fp32, FP8 ~0.037 (forward and grad_x)
    xb, wb = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    bf = F.linear(xb, wb.bfloat16())
    bf.backward(gout)
    assert rel(bf, ref) < 0.005 and rel(xb.grad, xr.grad) < 0.005
    assert rel(out, bf) > 0.01
    assert rel(x.grad, xb.grad) > 0.01


@pytest.mark.parametrize("scaling", SCALINGS)
def test_bf16_input_gradient_option(scaling):
    """fp8_grad_input=False: same forward and weight gradient, the input gradient a bf16 matmul."""
    x0, w0, gout = linear_inputs()
    grads = []
    for fp8_grad_input in (True, False):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = fp8_linear_dynamic(x, w, scaling, fp8_grad_input=fp8_grad_input)
        out.backward(gout)
        grads.append((out, x.grad, w.grad))
    (out8, gx8, gw8), (out, gx, gw) = grads
    assert torch.equal(out, out8) and torch.equal(gw, gw8)
    assert torch.equal(gx, (gout @ w0.bfloat16()).view_as(gx))
    assert rel(gx8, gx) > 0.01  # the default really is the FP8 one


@needs_rowwise
def test_rowwise_scaling_keeps_every_row_accurate():
    """Rows of activations (and of the output gradient) spanning 10^-6..1: per-row scales keep each row's
    relative error at the e4m3 level; one scale per tensor flushes the small rows. This fails if the
    rowwise flag is ignored in either direction."""
    g = torch.Generator().manual_seed(2)
    mag = 10.0 ** torch.linspace(-6, 0, 64)
    x0 = (F.rms_norm(torch.randn(64, 96, generator=g), (96,)) * mag[:, None]).bfloat16()
    w0 = torch.randn(128, 96, generator=g) * 0.05
    gout = (torch.randn(64, 128, generator=g) * mag.flip(0)[:, None]).bfloat16()
    ref_out = x0.float() @ w0.t()
    ref_gx = gout.float() @ w0

    def row_errors(scaling):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = fp8_linear_dynamic(x, w, scaling)
        out.backward(gout)
        e_out = (out.float() - ref_out).norm(dim=-1) / ref_out.norm(dim=-1)
        e_gx = (x.grad.float() - ref_gx).norm(dim=-1) / ref_gx.norm(dim=-1)
        return e_out, e_gx

    e_out, e_gx = row_errors("rowwise")
    assert e_out.max().item() < 0.1 and e_gx.max().item() < 0.1  # measured < 0.05
    e_out_t, e_gx_t = row_errors("tensorwise")
    assert e_out_t.max().item() > 0.5  # smallest rows underflow to (nearly) zero with a per-tensor e4m3 scale
    # ... but the tensorwise gradient is e5m2, whose range (2^-16..57344) covers the 10^6 spread of rows
    assert e_gx_t.max().item() < 0.15  # measured ~0.073 (e4m3 there would flush the small rows: ~1)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_zero_weight_gives_zero_output_and_input_grad(scaling):
    """MLP.proj starts at zero: amax 0 must not turn into NaN anywhere."""
    x0, _, gout = linear_inputs(seed=3)
    x = x0.clone().requires_grad_()
    w = torch.zeros(128, 96, requires_grad=True)
    out = fp8_linear_dynamic(x, w, scaling)
    assert torch.equal(out.float(), torch.zeros(4, 16, 128))
    out.backward(gout)
    assert torch.equal(x.grad.float(), torch.zeros(4, 16, 96))
    assert torch.isfinite(w.grad).all()
    # the weight still learns: grad_w = gout^T x, a bf16 matmul of non-zero operands
    ref_gw = gout.reshape(-1, 128).float().t() @ x0.reshape(-1, 96).float()
    assert rel(w.grad, ref_gw) < 0.01


def test_unknown_scaling_raises_naming_the_choices():
    x0, w0, _ = linear_inputs()
    with pytest.raises(ValueError, match="blockwise") as info:
        fp8_linear_dynamic(x0, w0, "blockwise")
    assert "rowwise" in str(info.value) and "tensorwise" in str(info.value)
    with pytest.raises(ValueError):
        fp8_linear_dynamic(x0, w0, "")


# -- wiring into the model ------------------------------------------------------------------------------

def test_build_model_sets_fp8_scaling_only_where_supported(monkeypatch):
    cfg = tiny_model_cfg("--model.fp8_mlp=true", "--model.fp8_scaling=tensorwise")
    m = build_model(cfg, 32, "cpu", seed=0)
    assert [b.mlp.fp8_scaling for b in m.blocks] == [""] * 4  # no FP8 support on CPU: bf16 MLP
    # where the device supports FP8, the configured scaling reaches every block, and only with fp8_mlp
    monkeypatch.setattr(runtime_module, "fp8_supported", lambda device: True)
    m = build_model(cfg, 32, "cpu", seed=0)
    assert [b.mlp.fp8_scaling for b in m.blocks] == ["tensorwise"] * 4
    m = build_model(tiny_model_cfg("--model.fp8_mlp=false"), 32, "cpu", seed=0)
    assert [b.mlp.fp8_scaling for b in m.blocks] == [""] * 4
    # _scaled_mm needs multiples of 16: an MLP of width 64 * 2.6 = 166 stays bf16
    m = build_model(tiny_model_cfg("--model.fp8_mlp=true", "--model.mlp_ratio=2.6"), 32, "cpu", seed=0)
    assert m.blocks[0].mlp.fc.weight.shape[0] % 16 and [b.mlp.fp8_scaling for b in m.blocks] == [""] * 4
    assert [b.attn.fp8_scaling for b in m.blocks] == [""] * 4  # fp8_attn is a switch of its own
    m = build_model(tiny_model_cfg("--model.fp8_attn=true"), 32, "cpu", seed=0)
    assert [b.attn.fp8_scaling for b in m.blocks] == ["rowwise"] * 4
    assert [b.mlp.fp8_scaling for b in m.blocks] == [""] * 4
    # attention-free layers have nothing to switch; heads of width 8 (hdim 40) stay bf16
    m = build_model(tiny_model_cfg("--model.fp8_attn=true", "--model.attn_free_layers=[1]"), 32, "cpu", seed=0)
    assert [b.attn.fp8_scaling if b.attn else None for b in m.blocks] == ["rowwise", None, "rowwise", "rowwise"]
    m = build_model(tiny_model_cfg("--model.fp8_attn=true", "--model.head_dim=8", "--model.model_dim=40"),
                    32, "cpu", seed=0)
    assert [b.attn.fp8_scaling for b in m.blocks] == [""] * 4


@pytest.mark.parametrize("scaling", SCALINGS)
def test_mlp_forward_runs_both_matmuls_in_fp8(scaling):
    mlp = MLP(64, 256)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        mlp.fc.weight.normal_(0, 0.1, generator=g)
        mlp.proj.weight.normal_(0, 0.05, generator=g)
    x = F.rms_norm(torch.randn(2, 8, 64, generator=g), (64,)).bfloat16()
    bf16 = mlp(x)
    mlp_fp8 = MLP(64, 256, fp8_scaling=scaling)
    mlp_fp8.load_state_dict(mlp.state_dict())
    out = mlp_fp8(x)
    h = fp8_linear_dynamic(x, mlp.fc.weight, scaling)
    assert torch.equal(out, fp8_linear_dynamic(F.relu(h).square(), mlp.proj.weight, scaling))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 8, 64)
    assert 0.01 < rel(out, bf16) < 0.1


@pytest.mark.parametrize("part", ["mlp", "attn"])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_model_with_fp8_matmuls_trains_like_bf16(scaling, part, one_thread):
    """The switched part's weight gradients (and the loss) stay close to bf16; only that part moves."""
    cfg = tiny_model_cfg(f"--model.fp8_{part}=true")
    runtime = runtime_module.runtime_for(cfg, "cpu", dtype=torch.bfloat16)
    m = build_model(cfg, 32, runtime, seed=0)
    assert all(getattr(b, part).fp8_scaling == "" for b in m.blocks)  # no FP8 on a CPU device
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # zero head / projections would make the loss and gradients trivial
        m.lm_head.weight.normal_(0, 0.05, generator=g)
        for b in m.blocks:
            b.mlp.proj.weight.normal_(0, 0.02, generator=g)
            b.attn.proj.weight.normal_(0, 0.02, generator=g)
    x, y = batch()

    def step(sc):
        nonlocal m
        if sc:  # the same weights in a model built with this part's matmuls in FP8
            m_fp8 = build_model(cfg, 32, runtime.replace(**{f"fp8_{part}": sc}), seed=0)
            m_fp8.load_state_dict(m.state_dict())
            assert all(getattr(b, part).fp8_scaling == sc for b in m_fp8.blocks)
            m = m_fp8
        m.zero_grad(set_to_none=True)
        loss = m(x, y)
        loss.backward()
        # not the scalar group (lambdas, skip weights): their gradients are sums with heavy cancellation
        scalars = {id(p) for p in m.param_groups()["scalar"]}
        return loss.item(), {n: p.grad.clone() for n, p in m.named_parameters()
                             if p.grad is not None and id(p) not in scalars}

    loss_bf, grads_bf = step("")
    loss_8, grads_8 = step(scaling)
    switched = {"mlp": (".mlp.fc.", ".mlp.proj."), "attn": (".attn.qkv_w", ".attn.proj.")}[part]
    assert sum(any(k in n for k in switched) for n in grads_8) == 8  # two matrices of 4 blocks
    assert abs(loss_8 - loss_bf) / loss_bf < 0.02
    for name, grad in grads_8.items():
        assert grad.dtype == torch.float32
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0, name
        err = rel(grad, grads_bf[name])
        assert err < 0.15, (name, err)  # measured 0.04-0.07
        if any(k in name for k in switched):
            assert err > 0.005, (name, err)  # the FP8 path is in the graph (bf16 reruns are bit-identical)


@pytest.mark.parametrize("scaling", SCALINGS)
def test_an_fp32_model_takes_the_fp8_attention_projections(scaling, one_thread):
    """train.dtype=float32 with fp8_attn (a GPU preset run in fp32): the FP8 qkv matmul gives bf16, which met the fp32
    value embeddings in v and attention refused the mixed q, k, v; the projection now gives the activations' dtype."""
    cfg = tiny_model_cfg("--model.fp8_attn=true")
    runtime = runtime_module.runtime_for(cfg, "cpu", dtype=torch.float32).replace(fp8_attn=scaling)
    m = build_model(cfg, 32, runtime, seed=0)
    assert [b.attn.fp8_scaling for b in m.blocks] == [scaling] * 4 and len(m.value_embeds) == 2
    x, y = batch()
    q, k, v = m.blocks[0].attn.qkv(torch.randn(2, 32, 64))
    assert q.dtype == k.dtype == v.dtype == torch.float32
    loss = m(x, y)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(torch.isfinite(b.attn.qkv_w.grad).all() for b in m.blocks)


# -- config -----------------------------------------------------------------------------------------------

def test_config_validates_fp8_scaling():
    cfg = apply_overrides(load_preset("tiny-cpu"), ["--model.fp8_mlp=true", "--model.fp8_scaling=blockwise"])
    with pytest.raises(ConfigError, match="fp8_scaling") as info:
        validate(cfg)
    assert "blockwise" in str(info.value) and "rowwise" in str(info.value) and "tensorwise" in str(info.value)
    for ok in ("rowwise", "tensorwise"):
        validate(apply_overrides(load_preset("tiny-cpu"), ["--model.fp8_mlp=true", f"--model.fp8_scaling={ok}"]))
    # the key's old name (config.toml files saved before the rename) still sets it
    assert apply_overrides(load_preset("tiny-cpu"), ["--model.fp8_mlp_scaling=tensorwise"]).model.fp8_scaling == "tensorwise"
