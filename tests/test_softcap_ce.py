"""Fused softcapped cross-entropy: the op's torch fallback (always, on CPU) and the Triton kernels
(on CUDA, or on CPU under TRITON_INTERPRET=1; skipped where triton is missing), all against
F.cross_entropy on fp32 capped logits: loss and gradient, every reduction, ignored rows, large
logits (so the cap matters), vocabularies that are no power of two and span several chunks.

Interpreter run: TRITON_INTERPRET=1 PYTHONPATH=. python -m pytest tests/test_softcap_ce.py
(TRITON_INTERPRET must be set before triton is imported: it decides at @triton.jit time.)"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from speedgpt.model.kernels import softcap_ce as sce
from speedgpt.model.kernels import softcap_ce_kernels as sce_kernels
from speedgpt.model.kernels.softcap_ce import (reference_grad, reference_rows, softcap_cross_entropy,
                                               softcap_cross_entropy_reference)

IGNORE = -100


def make(N=64, V=1000, scale=40.0, dtype=torch.bfloat16, seed=0, device="cpu", ignore_every=5):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(N, V, generator=g) * scale).clamp(-100, 100)  # |x| up to 100: the cap matters
    x[0, :] = 100.0  # a row saturated at +cap everywhere
    x[1, :] = -100.0  # and one at -cap
    t = torch.randint(0, V, (N,), generator=g)
    t[2] = V - 1  # last column (inside the final, partial chunk)
    if ignore_every:
        t[3::ignore_every] = IGNORE
    return x.to(dtype).to(device), t.to(device)


def torch_loss_and_grad(x, t, cap, reduction, upstream=None):
    """F.cross_entropy on the fp32-capped logits; gradient w.r.t. x (fp32 math, cast to x's dtype)."""
    xr = x.detach().float().requires_grad_()
    loss = softcap_cross_entropy_reference(xr, t, cap, reduction, IGNORE)
    (loss if upstream is None else loss * upstream).sum().backward()
    return loss.detach(), xr.grad


def ours_loss_and_grad(x, t, cap, reduction, upstream=None, inplace=False):
    leaf = x.detach().clone().requires_grad_()
    # in place: hand the op a non-leaf buffer (as the lm_head output is); its storage receives
    # the gradient, which then flows on to leaf.grad
    logits = leaf * 1 if inplace else leaf
    loss = softcap_cross_entropy(logits, t, cap, reduction, IGNORE, inplace_backward=inplace)
    (loss if upstream is None else loss * upstream).sum().backward()
    return loss.detach(), leaf.grad


def check_close(x, t, cap, reduction, upstream=None, inplace=False, grad_rtol=2e-2):
    ref_loss, ref_grad = torch_loss_and_grad(x, t, cap, reduction, upstream)
    loss, grad = ours_loss_and_grad(x, t, cap, reduction, upstream, inplace)
    assert loss.dtype == torch.float32 and loss.shape == ref_loss.shape
    torch.testing.assert_close(loss.cpu(), ref_loss.cpu(), rtol=1e-5, atol=1e-4)
    assert grad.dtype == x.dtype and grad.shape == x.shape
    # bf16 gradient: within a bf16 rounding of the fp32 gradient (plus a floor for tiny entries)
    atol = 1e-6 * ref_grad.abs().max().item() + 1e-12
    torch.testing.assert_close(grad.float().cpu(), ref_grad.cpu(), rtol=grad_rtol, atol=atol)
    rows = (t == IGNORE).cpu()
    assert rows.any() and (grad.float().cpu()[rows] == 0).all()


# ------------------------------------------------------------------ pure torch, always on CPU

def test_reference_rows_match_f_cross_entropy():
    x, t = make(dtype=torch.float32)
    loss, lse = reference_rows(x, t, 15.0, IGNORE)
    z = 15.0 * torch.tanh(x / 15.0)
    torch.testing.assert_close(loss, F.cross_entropy(z, t, reduction="none", ignore_index=IGNORE))
    torch.testing.assert_close(lse, torch.logsumexp(z, -1))
    assert (lse <= 15.0 + torch.log(torch.tensor(1000.0)) + 1e-4).all()  # capped: lse <= cap + ln V


def test_reference_grad_matches_autograd():
    x, t = make(dtype=torch.float32)
    up = torch.rand(x.shape[0]) + 0.5
    _, ref = torch_loss_and_grad(x, t, 15.0, "none", up)
    _, lse = reference_rows(x, t, 15.0, IGNORE)
    torch.testing.assert_close(reference_grad(x, t, lse, up, 15.0, IGNORE), ref, rtol=1e-5, atol=1e-7)


def test_cap_matters_on_this_data():
    """Guard against a vacuous test: the data is large enough that capped != uncapped."""
    x, t = make(dtype=torch.float32)
    capped = softcap_cross_entropy_reference(x, t, 15.0)
    plain = softcap_cross_entropy_reference(x, t, 0.0)
    assert (capped - plain).abs() > 1.0


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("inplace", [False, True])
def test_torch_fallback_op(reduction, inplace, monkeypatch):
    monkeypatch.setattr(sce, "available", lambda device=None: False)
    x, t = make()
    check_close(x, t, 15.0, reduction, upstream=torch.rand(x.shape[0]) + 0.5 if reduction == "none" else None,
                inplace=inplace)


def test_compiled_matches_eager_and_reinplaces(monkeypatch):
    """The custom ops trace without graph breaks; the in-place backward stays correct compiled."""
    monkeypatch.setattr(sce, "available", lambda device=None: False)
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(32, 16, generator=g), torch.randn(300, 16, generator=g) * 4
    t = torch.randint(0, 300, (32,), generator=g)
    t[::4] = IGNORE

    def f(h, w, inplace):
        return softcap_cross_entropy((h @ w.T).bfloat16(), t, 15.0, "mean", IGNORE, inplace_backward=inplace)

    grads = []
    for fn, inplace in ((f, False), (torch.compile(f, fullgraph=True), False), (torch.compile(f, fullgraph=True), True)):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        fn(hh, ww, inplace).backward()
        grads.append((hh.grad, ww.grad))
    for gh, gw in grads[1:]:
        torch.testing.assert_close(gh, grads[0][0])
        torch.testing.assert_close(gw, grads[0][1])


def test_all_ignored_mean_is_nan_like_torch(monkeypatch):
    monkeypatch.setattr(sce, "available", lambda device=None: False)
    x, t = make(N=4, V=50)
    t[:] = IGNORE
    assert torch.isnan(softcap_cross_entropy(x, t, 15.0)) and torch.isnan(softcap_cross_entropy_reference(x, t, 15.0))


def test_bad_arguments():
    x, t = make(N=4, V=50)
    with pytest.raises(ValueError):
        softcap_cross_entropy(x, t, 15.0, reduction="max")
    with pytest.raises(ValueError):
        softcap_cross_entropy(x, t[:3], 15.0)


def test_model_hook_matches_unfused_loss_and_grads():
    """GPT.forward with fused_ce on (forced on CPU: the op's torch fallback, or the Triton interpreter
    under TRITON_INTERPRET=1) gives the unfused path's loss and gradients; logits-only path unchanged."""
    from speedgpt.config import apply_overrides, load_preset
    from speedgpt.data.tokenizer import BOS_ID
    from speedgpt.model.build import build_model
    from speedgpt.model.runtime import runtime_for

    cfg = apply_overrides(load_preset("tiny-cpu"), ["--model.depth=2", "--model.model_dim=64",
                                                    "--model.head_dim=16", "--model.value_embeds=1",
                                                    "--model.logit_softcap=15.0"]).model
    assert cfg.fused_ce is False and cfg.logit_softcap > 0
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50257, (2, 16), generator=g)
    x[:, 0] = BOS_ID
    y = torch.randint(0, 50257, (2, 16), generator=g)
    y[0, 3] = IGNORE
    runtime = runtime_for(cfg, "cpu")
    assert runtime_for(cfg.__class__(**{**cfg.__dict__, "fused_ce": True}), "cpu").fused_ce is False  # never on off CUDA
    reference = build_model(cfg, 16, runtime, seed=0)
    with torch.no_grad():
        # non-uniform logits, some beyond the cap
        reference.lm_head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    fused_model = build_model(cfg, 16, runtime.replace(fused_ce=True), seed=0)  # forced on
    fused_model.load_state_dict(reference.state_dict())
    results = {}
    for fused, model in ((False, reference), (True, fused_model)):
        model.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        rows = model(x, y, reduction="none")
        results[fused] = (loss.detach(), rows.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
        assert model(x).shape == (2, 16, 50304)
    (l0, r0, g0), (l1, r1, g1) = results[False], results[True]
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r1, r0, rtol=1e-5, atol=1e-5)
    assert r1.shape == (2, 16) and r1[0, 3] == 0
    assert len(g0) == len(g1) and len(g0) > 5
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ the Triton kernels

def _kernel_device():
    if not sce.HAVE_TRITON:
        return None
    if torch.cuda.is_available() and not sce.interpreting():
        return "cuda"
    if sce.interpreting():
        return "cpu"
    return None


DEVICE = _kernel_device()
needs_kernels = pytest.mark.skipif(
    DEVICE is None, reason="needs triton and CUDA, or triton with TRITON_INTERPRET=1 set before import")


@pytest.fixture
def small_blocks(monkeypatch):
    """Chunks far smaller than the vocab, so the loop over chunks and the partial last one run."""
    monkeypatch.setitem(sce.CONFIG, "fwd_block_v", 256)
    monkeypatch.setitem(sce.CONFIG, "bwd_block_v", 128)
    monkeypatch.setitem(sce.CONFIG, "fwd_warps", 4)
    monkeypatch.setitem(sce.CONFIG, "bwd_warps", 4)


@needs_kernels
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("cap", [15.0, 60.0, 0.0])  # max-free path, online-max path, no cap
def test_kernel_matches_torch(reduction, cap, small_blocks):
    assert sce.available(DEVICE)
    x, t = make(V=1000, device=DEVICE)
    up = (torch.rand(x.shape[0]) + 0.5).to(DEVICE) if reduction == "none" else None
    check_close(x, t, cap, reduction, upstream=up)


@needs_kernels
@pytest.mark.parametrize("V", [777, 1000, 50])  # odd vocab; one chunk smaller than the block
def test_kernel_vocab_sizes_fp32_inplace(V, small_blocks):
    x, t = make(N=24, V=V, dtype=torch.float32, device=DEVICE, seed=V)
    check_close(x, t, 15.0, "mean", inplace=True, grad_rtol=1e-4)


@needs_kernels
def test_kernel_inplace_writes_into_the_logits(small_blocks):
    x, t = make(N=16, V=300, device=DEVICE)
    ref_loss, ref_grad = torch_loss_and_grad(x, t, 15.0, "sum")
    buf = x.clone()
    leaf = buf.clone().requires_grad_()
    logits = leaf + 0  # a fresh buffer owned by this graph
    ptr = logits.data_ptr()
    loss = softcap_cross_entropy(logits, t, 15.0, "sum", IGNORE, inplace_backward=True)
    loss.backward()
    assert leaf.grad.data_ptr() == ptr or torch.equal(logits.detach(), leaf.grad)  # logits now hold dL/dx
    torch.testing.assert_close(logits.detach().float().cpu(), ref_grad.cpu(), rtol=2e-2,
                               atol=1e-6 * ref_grad.abs().max().item())


@needs_kernels
def test_kernel_lse_and_rows(small_blocks):
    x, t = make(N=32, V=1000, dtype=torch.float32, device=DEVICE)
    loss, lse = sce._triton_fwd(x, t, 15.0, IGNORE)
    rloss, rlse = reference_rows(x, t, 15.0, IGNORE)
    torch.testing.assert_close(lse, rlse, rtol=1e-6, atol=2e-5)
    torch.testing.assert_close(loss, rloss, rtol=1e-6, atol=2e-5)


@needs_kernels
def test_kernel_default_config_blocks(monkeypatch):
    """The shipped (GPU) block sizes, with a vocab that spans two 4096-chunks."""
    x, t = make(N=8, V=5000, device=DEVICE)
    check_close(x, t, 15.0, "mean")


@needs_kernels
def test_kernel_non_contiguous_rows(small_blocks):
    x, t = make(N=16, V=600, device=DEVICE)
    wide = torch.zeros(16, 700, dtype=x.dtype, device=DEVICE)
    wide[:, :600] = x
    view = wide[:, :600]  # row stride 700, last dim contiguous: used as is
    loss = softcap_cross_entropy(view, t, 15.0, "none")
    torch.testing.assert_close(loss, softcap_cross_entropy_reference(x, t, 15.0, "none"), rtol=1e-5, atol=1e-4)


@needs_kernels
@pytest.mark.parametrize("tanh", ["exp", "approx"])
@pytest.mark.parametrize("cap,V,N,tiles", [(15.0, 1000, 40, (16, 128, 4)), (0.0, 257, 40, (16, 128, 4)),
                                           (50.0, 700, 40, (16, 128, 4)), (15.0, 2000, 300, None),
                                           (15.0, 512, 64, (16, 128, 4))])  # the last: tiles divide (EVEN)
def test_fp8_grad_kernel_matches_reference(cap, V, N, tiles, tanh, monkeypatch):
    """Loss and scaled gradient, in both layouts. Written to fp32 buffers the kernel's math is checked
    exactly (the interpreter truncates fp8 casts); the e5m2 output on CUDA is checked against the
    reference rounded the same way. Partial tiles in both dimensions; small and default tiles. The
    approximate tanh (the default on the GPU; no interpreter support) is checked to its own accuracy."""
    if tanh == "approx" and DEVICE != "cuda":
        pytest.skip("tanh.approx.f32 is PTX: GPU only")
    monkeypatch.setitem(sce.CONFIG, "fp8g_tanh", tanh)
    if tiles:
        for key, value in zip(("fp8g_block_n", "fp8g_block_v", "fp8g_warps"), tiles):
            monkeypatch.setitem(sce.CONFIG, key, value)
    x, t = make(N=N, V=V, scale=8.0, device=DEVICE)
    loss_ref, lse = reference_rows(x.cpu(), t.cpu(), cap, IGNORE)
    g_ref = reference_grad(x.cpu().float(), t.cpu(), lse, torch.full_like(lse, 2.0 ** 15), cap, IGNORE)
    dtypes = [torch.float32] + ([torch.float8_e5m2] if DEVICE == "cuda" else [])
    for dtype in dtypes:
        loss, g, gt = sce._triton_fp8_grad(x, t, cap, 2.0 ** 15, IGNORE, dtype)
        torch.testing.assert_close(loss.cpu(), loss_ref, rtol=1e-5, atol=1e-4)
        assert g.dtype == gt.dtype == dtype and gt.shape == (V, N)
        assert torch.equal(gt.cpu(), g.cpu().T.contiguous())
        expect = g_ref.to(dtype).float()
        err = (g.cpu().float() - expect).norm() / expect.norm()
        tol = {torch.float32: 1e-5 if tanh == "exp" else 1e-2}.get(dtype, 2e-2 if tanh == "exp" else 3e-2)
        assert err < tol, (dtype, tanh, err)
        assert g[t == IGNORE].float().abs().sum() == 0


@pytest.mark.skipif(DEVICE != "cuda", reason="the f16 gradient kernel is GPU only (inline PTX)")
def test_fp8_grad_fast_kernel_keeps_confident_targets(monkeypatch):
    """The GPU kernel's f16 math must not round away g * (p - 1) at a confidently predicted target
    (p within ~1e-3 of 1): each target entry within one e5m2 step of the reference's."""
    for key, value in zip(("fp8g_block_n", "fp8g_block_v", "fp8g_warps", "fp8g_fast"), (16, 128, 4, True)):
        monkeypatch.setitem(sce.CONFIG, key, value)
    N, V, cap = 64, 512, 15.0  # tiles divide the shape: the fast kernel runs
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(N, V, generator=gen) * 0.5 - 2.5).to(torch.bfloat16).to(DEVICE)
    t = torch.randint(0, V, (N,), generator=gen).to(DEVICE)
    rows = torch.arange(N, device=DEVICE)
    x[rows, t] = torch.where(rows % 2 == 0, 30.0, 20.0).to(x.dtype)  # p_t = 1 - O(1e-4 .. 1e-5)
    loss_ref, lse = reference_rows(x.cpu(), t.cpu(), cap, IGNORE)
    g_ref = reference_grad(x.cpu().float(), t.cpu(), lse, torch.full_like(lse, 2.0 ** 15), cap, IGNORE)
    _, g, gt = sce._triton_fp8_grad(x, t, cap, 2.0 ** 15, IGNORE, torch.float8_e5m2)
    ours = g.cpu().float()[rows.cpu(), t.cpu()]
    ref = g_ref.to(torch.float8_e5m2).float()[rows.cpu(), t.cpu()]
    assert (ref < 0).all()
    assert ((ours - ref).abs() <= 0.25 * ref.abs()).all(), (ours, ref)
    assert torch.equal(gt.cpu(), g.cpu().T.contiguous())


@pytest.mark.skipif(DEVICE != "cuda", reason="the f16 gradient kernel is GPU only (inline PTX)")
@pytest.mark.parametrize("cap,ignore_index", [(15.0, IGNORE), (15.0, 7), (40.0, IGNORE)])
def test_fp8_grad_fast_kernel_default_tiles(cap, ignore_index):
    """The shipped configuration (the f16 kernel, default tiles) on a shape its tiles divide: G^T is G
    transposed bit for bit, ignored rows (also for an ignore_index that is a valid class) are zero, and
    G matches the e5m2-rounded reference (the cap = 40 bound of the fast path included)."""
    bn, bv = sce.CONFIG["fp8g_block_n"], sce.CONFIG["fp8g_block_v"]
    N, V = 2 * bn, 2 * bv
    x, t = make(N=N, V=V, scale=8.0, device=DEVICE, ignore_every=0)
    t[3::5] = ignore_index
    loss_ref, lse = reference_rows(x.cpu(), t.cpu(), cap, ignore_index)
    g_ref = reference_grad(x.cpu().float(), t.cpu(), lse, torch.full_like(lse, 2.0 ** 15), cap, ignore_index)
    loss, g, gt = sce._triton_fp8_grad(x, t, cap, 2.0 ** 15, ignore_index, torch.float8_e5m2)
    torch.testing.assert_close(loss.cpu(), loss_ref, rtol=1e-5, atol=1e-4)
    assert torch.equal(gt.cpu(), g.cpu().T.contiguous())
    expect = g_ref.to(torch.float8_e5m2).float()
    assert ((g.cpu().float() - expect).norm() / expect.norm()) < 3e-2
    assert g[t == ignore_index].float().abs().sum() == 0


@needs_kernels
def test_fp8_grad_rejects_offsets_beyond_32_bits(monkeypatch):
    """Tile offsets are 32-bit: a shape that would overflow them is refused before any launch."""
    monkeypatch.setitem(sce.CONFIG, "fp8g_block_v", 2 ** 21)
    x, t = make(N=1024, V=64, device=DEVICE)
    with pytest.raises(ValueError, match="32-bit"):
        sce._triton_fp8_grad(x, t, 15.0, 2.0 ** 15, IGNORE, torch.float32)


def _ptxas_available():
    if not sce.HAVE_TRITON or sce.interpreting():
        return False
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _ptxas_available(), reason="needs triton with its CUDA backend (ptxas), no interpreter")
@pytest.mark.parametrize("kernel", ["fwd", "bwd", "fp8_grad"])
def test_kernels_compile_for_hopper_with_wide_loads(kernel):
    """Ahead-of-time compile for sm_90 (no GPU needed): the vocab loop uses 128-bit loads and
    stores (the JIT specializes V = 50304 and the row stride as multiples of 16), three MUFU
    ops per element, and no register spills."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if kernel == "fwd":
        fn = sce_kernels._softcap_ce_fwd_kernel
        sig = {"X": "*bf16", "stride_x": "i32", "T": "*i64", "W": "*fp32", "LOSS": "*fp32", "LSE": "*fp32",
               "V": "i32", "cap": "fp32", "a": "fp32", "b": "fp32", "ignore_index": "i32"}
        consts = {"HAS_CAP": True, "FIXED_MAX": True, "TANH": 0, "BLOCK_V": 4096}
    elif kernel == "bwd":
        fn = sce_kernels._softcap_ce_bwd_kernel
        sig = {"X": "*bf16", "stride_x": "i32", "G": "*bf16", "stride_g": "i32", "T": "*i64", "W": "*fp32",
               "LSE": "*fp32", "DLOSS": "*fp32", "stride_dloss": "i32", "V": "i32", "cap": "fp32", "a": "fp32",
               "b": "fp32", "ignore_index": "i32"}
        consts = {"HAS_CAP": True, "TANH": 0, "BLOCK_V": 4096}
    else:  # the GPU's e5m2 gradient kernel (f16x2 math, inline PTX: checked by ptxas here)
        fn = sce_kernels._softcap_ce_fp8_grad_fast_kernel
        sig = {"X": "*bf16", "stride_x": "i32", "T": "*i64", "W": "*fp32", "LSE": "*fp32", "G": "*fp8e5",
               "GT16": "*i16", "N": "i32", "V": "i32", "cap": "fp32", "a": "fp32", "b": "fp32", "g_scale": "fp32",
               "log2_g_scale": "fp32", "ignore_index": "i32"}
        consts = {"HAS_CAP": True, "BLOCK_N": 64, "BLOCK_V": 128}
    consts.update(AFFINE=False, K=1, HAS_W=False)  # one target, no map: the kernels as before MTP (the model's 124m)
    sig.update({k: "constexpr" for k in consts})
    aligned = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(sig.items())
               if ty.startswith("*") or name in ("stride_x", "stride_g", "V", "N")}
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=aligned), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 8})
    ptx = k.asm["ptx"]
    assert ".local" not in ptx  # no spills to local memory
    if kernel == "fp8_grad":
        # one packed tanh and one packed exp2 per two elements (64 x 128 / 256 threads / 2 = 16 each): the
        # math is done once, not again for the transposed store
        assert ptx.count("tanh.approx.f16x2") == 16 and ptx.count("ex2.approx.f16x2") == 16
        assert not re.search(r"st\.shared(\.v\d)?\.[bsu]8", ptx)  # no 8-bit values through shared memory
        assert re.search(r"st\.global[\w.:]*\.v\d\.b32", ptx), "fp8 stores not vectorized"
        return
    assert "ld.global" in ptx and re.search(r"ld\.global[\w.:]*\.v4\.b32", ptx), "vocab loads not 128-bit"
    if kernel == "bwd":
        assert re.search(r"st\.global[\w.:]*\.v4\.b32", ptx), "gradient stores not 128-bit"
    # 16 elements per thread per chunk (4096 / 256 threads): 2 ex2 + 1 reciprocal each
    assert ptx.count("ex2.approx") >= 32 and ptx.count("ex2.approx") <= 40
    assert ".local" not in ptx  # no spills to local memory


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q", *(["-rs"] if not os.environ.get("TRITON_INTERPRET") else [])]))
