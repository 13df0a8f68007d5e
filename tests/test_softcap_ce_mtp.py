"""The fused loss's multi-token prediction (K weighted targets per row) and affine logit map
(z = cap * tanh((a x + b) / cap), record #54's rescale): the op's torch fallback (always, on CPU) and the
Triton kernels (on CUDA, or on CPU under TRITON_INTERPRET=1; skipped where triton is missing), against a
float64 autograd oracle and against model/mtp.py's multi_token_loss; then the model's fused paths against
its unfused ones.

Interpreter run: TRITON_INTERPRET=1 PYTHONPATH=. python -m pytest tests/test_softcap_ce_mtp.py"""

from __future__ import annotations

import pytest
import torch

from speedgpt.model.gates import rescale_as_affine_softcap, rescale_logits
from speedgpt.model.kernels import softcap_ce as sce
from speedgpt.model.kernels import softcap_ce_kernels as sce_kernels
from speedgpt.model.kernels.softcap_ce import softcap_ce_fp8_grad, softcap_cross_entropy
from speedgpt.model.mtp import multi_token_loss, target_rows

IGNORE = -100
RESCALE = rescale_as_affine_softcap()  # (cap, a, b) of record #54's map


def make(N=24, V=300, K=3, scale=12.0, dtype=torch.float32, seed=0, device="cpu"):
    """Logits beyond the cap, K targets per row with the row-end pattern of target_rows (the last K-1 rows
    lose their later targets), a row with every target invalid, and a repeated target."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(N, V, generator=g) * scale).clamp(-80, 80)
    t = torch.randint(0, V, (N, K), generator=g)
    for j in range(1, K):
        t[N - j:, j] = IGNORE  # past the end of the row
    if N > 5:
        t[5, :] = IGNORE  # no valid target at all
    if K > 1:
        t[2, 1] = t[2, 0]  # the same token at two offsets
    t[3, 0] = V - 1  # last column
    return x.to(dtype).to(device), t.to(device)


def oracle(x, t, w, cap, a=1.0, b=0.0, upstream=None):
    """float64: per-row sum_k w_k * CE(z, t_k) over valid targets, and d(sum rows * upstream)/dx by autograd."""
    x64 = x.detach().cpu().double().requires_grad_()
    y = x64 * a + b
    z = cap * torch.tanh(y / cap) if cap else y
    lse = torch.logsumexp(z, 1, keepdim=True)
    t = t.cpu().reshape(x.shape[0], -1)
    valid = t != IGNORE
    ce = torch.where(valid, lse - z.gather(1, torch.where(valid, t, 0)), 0.0)
    rows = (ce * w.cpu().double().reshape(1, -1)).sum(1)
    up = torch.ones_like(rows) if upstream is None else upstream.cpu().double()
    (rows * up).sum().backward()
    return rows.detach(), x64.grad


def rel(a, b):
    return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()


# ------------------------------------------------------------------ the op's semantics, torch fallback

@pytest.fixture
def fallback(monkeypatch):
    monkeypatch.setattr(sce, "available", lambda device=None: False)


def test_weighted_rows_are_multi_token_loss(fallback):
    """target_rows + weights through the fused op give mtp.py's loss: the same terms, row ends left out,
    divided by B*T (not by the valid targets), and the same gradient (the op's loss is fp32)."""
    torch.manual_seed(0)
    B, T, V = 2, 6, 40
    logits = (torch.randn(B, T, V) * 3).requires_grad_()
    targets = torch.randint(0, V, (B, T))
    for w in ([1.0, 0.5, 0.25], [1.0, 0.0], [1.0, 0.5, 0.0, 2.0]):
        w = torch.tensor(w)
        ref = multi_token_loss(logits.double(), targets, w)
        (g_ref,) = torch.autograd.grad(ref, logits)
        ours = softcap_cross_entropy(logits.view(B * T, V), target_rows(targets, len(w)), 0.0, weights=w)
        (g_ours,) = torch.autograd.grad(ours, logits)
        torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=0)
        torch.testing.assert_close(g_ours, g_ref.float(), rtol=1e-5, atol=1e-7)


def test_target_rows_mark_the_row_end_invalid():
    rows = target_rows(torch.arange(10).view(2, 5), 3)
    assert rows.shape == (10, 3)
    assert rows[3].tolist() == [3, 4, IGNORE] and rows[4].tolist() == [4, IGNORE, IGNORE]
    assert rows[5].tolist() == [5, 6, 7]  # the second row starts afresh


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("inplace", [False, True])
def test_fallback_weights_and_map_match_the_oracle(reduction, inplace, fallback):
    cap, a, b = RESCALE
    x, t = make()
    w = torch.tensor([1.0, 0.5, 0.0])  # a zero weight too
    up = torch.rand(x.shape[0]) + 0.5 if reduction == "none" else None
    rows, grad = oracle(x, t, w, cap, a, b, up)
    leaf = x.clone().requires_grad_()
    loss = softcap_cross_entropy(leaf * 1 if inplace else leaf, t, cap, reduction, IGNORE, inplace, weights=w,
                                 scale=a, shift=b)
    expect = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / x.shape[0]}[reduction]
    torch.testing.assert_close(loss.double(), expect, rtol=1e-5, atol=1e-5)
    (loss if up is None else loss * up).sum().backward()
    if reduction == "mean":
        grad = grad / x.shape[0]
    assert rel(leaf.grad, grad) < 1e-5
    assert (leaf.grad[5] == 0).all()  # no valid target: no gradient


def test_fallback_map_alone_is_record_54s_loss(fallback):
    """One target, the affine map, no weights: the cross-entropy of 23 sigmoid((x + 5) / 7.5)."""
    cap, a, b = RESCALE
    x, t = make(K=1)
    t = t[:, 0].contiguous()
    ref = torch.nn.functional.cross_entropy(rescale_logits(x.double()), t, ignore_index=IGNORE)
    torch.testing.assert_close(softcap_cross_entropy(x, t, cap, scale=a, shift=b).double(), ref, rtol=1e-5, atol=0)


def test_fp8_grad_fallback_weights_and_map(fallback):
    cap, a, b = RESCALE
    x, t = make(K=2)
    w = torch.tensor([1.0, 0.75])
    rows, grad = oracle(x, t, w, cap, a, b)
    loss, g, gt = softcap_ce_fp8_grad(x, t, cap, 256.0, IGNORE, torch.float32, weights=w, scale=a, shift=b)
    torch.testing.assert_close(loss.double(), rows, rtol=1e-5, atol=1e-5)
    assert rel(g, 256.0 * grad) < 1e-5 and torch.equal(gt, g.T)


def test_bad_targets_and_weights_are_refused():
    x, t = make(N=4, V=20)
    with pytest.raises(ValueError, match="do not match"):
        softcap_cross_entropy(x, t, 15.0)  # K targets need K weights
    with pytest.raises(ValueError, match="3 weights"):
        softcap_cross_entropy(x, t[:, :2], 15.0, weights=torch.ones(3))
    with pytest.raises(ValueError, match="0-d or 1-d"):
        softcap_cross_entropy(x, t, 15.0, weights=torch.ones(1, 3))


def test_compiled_op_does_not_recompile_for_new_weights(fallback):
    """Weights are a tensor input of the custom op: new values reuse the graph, a new K is a new shape."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    x, t = make(N=8, V=50)
    fn = torch.compile(lambda x, t, w: softcap_cross_entropy(x, t, 15.0, weights=w), fullgraph=True,
                       backend="aot_eager", dynamic=False)
    for w in ([1.0, 0.5, 0.25], [1.0, 0.5, 0.125], [1.0, 0.25, 0.0]):
        w = torch.tensor(w)
        torch.testing.assert_close(fn(x, t, w), softcap_cross_entropy(x, t, 15.0, weights=w))
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_compiled_fp8_head_with_weights_traces_whole_and_keeps_its_graph(fallback):
    """The FP8 head's autograd.Function with weights and the map under torch.compile(fullgraph): eager's loss
    and gradients, and new weight values reuse the graph."""
    from torch._dynamo.utils import counters

    from speedgpt.model.fp8_head import fp8_head_cross_entropy

    cap, a, b = RESCALE
    g = torch.Generator().manual_seed(2)
    x = torch.nn.functional.rms_norm(torch.randn(16, 32, generator=g), (32,))
    w = torch.randn(60, 32, generator=g) * 0.3
    t = target_rows(torch.randint(0, 60, (2, 8), generator=g), 3)

    def f(xx, ww, weights):
        return fp8_head_cross_entropy(xx, ww, t, cap, 6 / 448, 1 / 448, weights=weights, scale=a, shift=b)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=False)
    for weights in ([1.0, 0.5, 0.25], [1.0, 0.5, 0.125]):
        runs = []
        for fn in (f, compiled):
            xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
            loss = fn(xx, ww, torch.tensor(weights))
            loss.backward()
            runs.append((loss.detach(), xx.grad, ww.grad))
        for got, ref in zip(*runs[::-1]):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7)
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


# ------------------------------------------------------------------ the model's paths

def _model_pair(extra, fp8_head=False):
    """(unfused reference model, the same weights on the fused loss path), forced on CPU (the fused op's
    torch fallback there, or the Triton interpreter under TRITON_INTERPRET=1)."""
    from speedgpt.config import apply_overrides, load_preset
    from speedgpt.model.build import build_model
    from speedgpt.model.runtime import runtime_for

    cfg = apply_overrides(load_preset("tiny-cpu"), ["--model.depth=2", "--model.model_dim=64", "--model.head_dim=16",
                                                    "--model.value_embeds=1", "--model.vocab_size=250",
                                                    "--model.vocab_pad_multiple=1", *extra]).model
    runtime = runtime_for(cfg, "cpu")
    reference = build_model(cfg, 16, runtime, seed=0)
    with torch.no_grad():  # non-uniform logits, some beyond the cap; seeded here, not by the tests run before
        reference.lm_head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    fused = build_model(cfg, 16, runtime.replace(fused_ce=True, fp8_head=fp8_head), seed=0)
    fused.load_state_dict(reference.state_dict())
    assert reference.loss_path == "torch" and fused.loss_path == ("fp8_fused" if fp8_head else "fused_ce")
    return reference, fused


def _loss_and_grads(model, x, y, w):
    model.zero_grad(set_to_none=True)
    loss = model(x, y, mtp_weights=w)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch(V=250):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, V, (2, 16), generator=g), torch.randint(0, V, (2, 16), generator=g)


@pytest.mark.parametrize("rescale", [False, True])
def test_model_fused_mtp_matches_the_torch_path(rescale):
    """GPT.forward with MTP weights (and record #54's rescale) through the fused loss: the unfused
    model's loss and every gradient."""
    reference, fused = _model_pair([f"--model.logit_rescale={str(rescale).lower()}"])
    assert fused.fused_mtp
    x, y = _batch()
    w = torch.tensor([1.0, 0.5, 0.25])
    (l0, g0), (l1, g1) = _loss_and_grads(reference, x, y, w), _loss_and_grads(fused, x, y, w)
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-5)
    assert g0.keys() == g1.keys() and len(g0) > 5
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6, msg=name)


def test_model_fused_mtp_off_takes_the_torch_loss_exactly():
    """model.fused_mtp=false: MTP is multi_token_loss over the softcapped fp32 logits, bit for bit."""
    _, fused = _model_pair(["--model.fused_mtp=false", "--model.logit_rescale=true"])
    assert not fused.fused_mtp
    x, y = _batch()
    w = torch.tensor([1.0, 0.5])
    with torch.no_grad():
        assert torch.equal(fused(x, y, mtp_weights=w), multi_token_loss(fused(x), y, w))


@pytest.mark.parametrize("rescale", [False, True])
def test_model_fp8_head_fused_mtp_matches_the_torch_path(rescale, fallback):
    """The FP8 head's fused op with MTP (and the rescale): e4m3 logits and an e5m2 logit gradient, so
    within FP8's error of the fp32 model; and the fused op runs (not the unfused head). Through the op's
    torch fallback: the interpreter truncates e5m2 casts (a biased error of ~25 %); the kernels' e5m2
    math is checked below, exactly in fp32 buffers and rounded on CUDA."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(func)
            return func(*args, **(kwargs or {}))

    reference, fused = _model_pair([f"--model.logit_rescale={str(rescale).lower()}"], fp8_head=True)
    x, y = _batch()
    w = torch.tensor([1.0, 0.5, 0.25])
    l0, g0 = _loss_and_grads(reference, x, y, w)
    with Calls() as calls:
        l1, g1 = _loss_and_grads(fused, x, y, w)
    assert torch.ops.speedgpt.fp8_head_ce_fwd.default in calls.ops
    assert torch.ops.speedgpt.fp8_linear_fwd.default not in calls.ops
    assert abs(l1 - l0) < 0.01 * l0
    # scalars (lambdas) left out: sums of few, cancelling terms, their relative error says little
    errors = {n: rel(g1[n], g0[n]) for n in g0 if g0[n].ndim >= 2 and "lambdas" not in n and g0[n].norm() > 0}
    # e5m2 keeps 2 mantissa bits, a rounding error of up to 12.5 % an element of the logit gradient that feeds every
    # matrix's: over 12 initialisations of the head the worst matrix was 0.088-0.110 off without the rescale,
    # 0.048-0.058 with it (2026-12-06; 0.1 had failed whenever the tests before left the global RNG at such a head;
    # the seeded head now gives 0.1085 and 0.0512): the rescale keeps the earlier bound
    assert len(errors) >= 5 and max(errors.values()) < (0.1 if rescale else 0.15), errors


def test_fp8_head_weights_past_one_keep_the_gradient_in_range(fallback):
    """Weights summing to 4 would put the e5m2 gradient (G_SCALE * 4) past e5m2's largest value; the head
    divides them by their sum and multiplies back, so loss and gradients equal the scaled-down weights' x 4."""
    from speedgpt.model.fp8_head import fp8_head_cross_entropy

    g = torch.Generator().manual_seed(1)
    x = torch.nn.functional.rms_norm(torch.randn(32, 64, generator=g), (64,))
    w = torch.randn(100, 64, generator=g) * 0.3
    t = torch.randint(0, 100, (32, 4), generator=g)
    t[::2] = t[::2, :1]  # one token at all four offsets: its gradient entry is 4 (p - 1)
    out = []
    for weights, mult in ((torch.tensor([1.0, 1.0, 1.0, 1.0]), 1.0), (torch.tensor([0.25, 0.25, 0.25, 0.25]), 4.0)):
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = fp8_head_cross_entropy(xx, ww, t, 15.0, 8 / 448, 1 / 448, weights=weights) * mult
        loss.backward()
        out.append((loss.item(), xx.grad, ww.grad))
    (l_a, gx_a, gw_a), (l_b, gx_b, gw_b) = out
    assert torch.isfinite(gx_a).all() and l_a == pytest.approx(l_b, rel=1e-5)
    assert rel(gx_a, gx_b) < 1e-5 and rel(gw_a, gw_b) < 1e-5


# ------------------------------------------------------------------ the Triton kernels

def _kernel_device():
    if not sce.HAVE_TRITON:
        return None
    if torch.cuda.is_available() and not sce.interpreting():
        return "cuda"
    return "cpu" if sce.interpreting() else None


DEVICE = _kernel_device()
needs_kernels = pytest.mark.skipif(
    DEVICE is None, reason="needs triton and CUDA, or triton with TRITON_INTERPRET=1 set before import")


@pytest.fixture
def small_blocks(monkeypatch):
    """Chunks and tiles far smaller than the vocab: the loops over chunks and partial chunks/tiles run."""
    for key, value in (("fwd_block_v", 128), ("bwd_block_v", 64), ("fwd_warps", 4), ("bwd_warps", 4),
                       ("fp8g_block_n", 8), ("fp8g_block_v", 64), ("fp8g_warps", 4), ("fp8g_tanh", "exp")):
        monkeypatch.setitem(sce.CONFIG, key, value)


KERNEL_CASES = [  # (cap, a, b, K, weights)
    (15.0, 1.0, 0.0, 3, [1.0, 0.5, 0.25]),  # the max-free logsumexp
    (*RESCALE, 2, [1.0, 0.0]),  # record #54's map, a zero weight
    (*RESCALE, 1, None),  # the map alone (speedrun-latest's last stage)
    (60.0, 1.3, -2.0, 3, [1.0, 2.0, 0.5]),  # online max, a factor above 1
    (0.0, 0.5, 1.0, 2, [1.0, 0.5]),  # no cap: z = a x + b
    (15.0, 1.0, 0.0, 1, [0.5]),  # one weighted target
]


@needs_kernels
@pytest.mark.parametrize("cap,a,b,K,w", KERNEL_CASES)
def test_kernels_match_the_oracle(cap, a, b, K, w, small_blocks):
    """Forward rows, the bf16-path backward (out of place and in place) and the fp8-path gradient (fp32
    buffers: the kernel's math exactly), all against float64."""
    x, t = make(K=K, device=DEVICE)
    if w is None:
        t, weights, wt = t[:, 0].contiguous(), None, torch.ones(1)
    else:
        weights = wt = torch.tensor(w, device=DEVICE)
    up = (torch.rand(x.shape[0]) + 0.5).to(DEVICE)
    rows, grad = oracle(x, t, wt, cap, a, b, up)
    loss, lse = sce._triton_fwd(x, t, cap, IGNORE, weights, a, b)
    torch.testing.assert_close(loss.double().cpu(), rows, rtol=1e-5, atol=2e-5)
    g = sce._triton_bwd(x, t, lse, up, cap, IGNORE, torch.empty_like(x), weights, a, b)
    assert rel(g, grad) < 1e-5
    buf = x.clone()
    sce._triton_bwd(buf, t, lse, up, cap, IGNORE, buf, weights, a, b)
    assert torch.equal(buf, g)
    assert (g[5] == 0).all()  # no valid target
    _, grad1 = oracle(x, t, wt, cap, a, b)
    loss8, g8, gt8 = sce._triton_fp8_grad(x, t, cap, 2.0 ** 10, IGNORE, torch.float32, weights, a, b)
    torch.testing.assert_close(loss8, loss)
    assert rel(g8, 2.0 ** 10 * grad1) < 1e-5 and torch.equal(gt8, g8.T.contiguous())


@needs_kernels
def test_kernel_even_tiles_and_bf16_logits(small_blocks):
    """Tiles that divide the shape (the EVEN branch) and bf16 logits as the head writes them."""
    cap, a, b = RESCALE
    x, t = make(N=32, V=256, dtype=torch.bfloat16, device=DEVICE)
    w = torch.tensor([1.0, 0.5, 0.25], device=DEVICE)
    _, grad = oracle(x, t, w, cap, a, b)
    loss, g8, gt8 = sce._triton_fp8_grad(x, t, cap, 1.0, IGNORE, torch.float32, w, a, b)
    assert rel(g8, grad) < 1e-5 and torch.equal(gt8, g8.T.contiguous())
    leaf = x.clone().requires_grad_()
    softcap_cross_entropy(leaf, t, cap, "sum", weights=w, scale=a, shift=b).backward()
    assert leaf.grad.dtype == torch.bfloat16 and rel(leaf.grad, grad) < 1e-2  # one bf16 rounding


@pytest.mark.skipif(DEVICE != "cuda", reason="the f16 gradient kernel is GPU only (inline PTX)")
@pytest.mark.parametrize("cap,a,b,K,w", [c for c in KERNEL_CASES if 0 < c[0] <= 40])
def test_fp8_grad_fast_kernel_weights_and_map(cap, a, b, K, w):
    """The GPU's f16 kernel (default tiles) with weights and the map: G^T is G transposed bit for bit,
    G matches the e5m2-rounded float64 gradient, confident targets keep their digits."""
    bn, bv = sce.CONFIG["fp8g_block_n"], sce.CONFIG["fp8g_block_v"]
    x, t = make(N=2 * bn, V=2 * bv, scale=8.0, K=K, device=DEVICE)
    rows_idx = torch.arange(x.shape[0], device=DEVICE)
    x[rows_idx[::3], t[::3, 0].clamp(min=0)] = 30.0  # p of the first target near 1
    if w is None:
        t, weights, wt = t[:, 0].contiguous(), None, torch.ones(1)
    else:
        weights = wt = torch.tensor(w, device=DEVICE)
    rows, grad = oracle(x, t, wt, cap, a, b)
    g_scale = 2.0 ** 15 / max(1.0, sum(wt.tolist()))
    loss, g, gt = sce._triton_fp8_grad(x, t, cap, g_scale, IGNORE, torch.float8_e5m2, weights, a, b)
    torch.testing.assert_close(loss.double().cpu(), rows, rtol=1e-5, atol=1e-4)
    assert torch.equal(gt.cpu(), g.cpu().T.contiguous())
    expect = (g_scale * grad).to(torch.float8_e5m2).double()
    assert rel(g.float(), expect) < 3e-2


@pytest.mark.skipif(not sce.HAVE_TRITON or sce.interpreting(),
                    reason="needs triton's CUDA backend (ptxas), no interpreter")
def test_weighted_kernels_compile_for_hopper_without_spills():
    """Ahead-of-time compile for sm_90 (no GPU needed) of every kernel with K = 3 weighted targets and the
    map: no register spills to local memory."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    common = {"AFFINE": True, "K": 3, "HAS_W": True}
    kernels = {
        sce_kernels._softcap_ce_fwd_kernel: ({"X": "*bf16", "stride_x": "i32", "T": "*i64", "W": "*fp32", "LOSS": "*fp32",
                                      "LSE": "*fp32", "V": "i32", "cap": "fp32", "a": "fp32", "b": "fp32",
                                      "ignore_index": "i32"},
                                     {"HAS_CAP": True, "FIXED_MAX": True, "TANH": 0, "BLOCK_V": 4096}),
        sce_kernels._softcap_ce_bwd_kernel: ({"X": "*bf16", "stride_x": "i32", "G": "*bf16", "stride_g": "i32", "T": "*i64",
                                      "W": "*fp32", "LSE": "*fp32", "DLOSS": "*fp32", "stride_dloss": "i32",
                                      "V": "i32", "cap": "fp32", "a": "fp32", "b": "fp32", "ignore_index": "i32"},
                                     {"HAS_CAP": True, "TANH": 0, "BLOCK_V": 4096}),
        sce_kernels._softcap_ce_fp8_grad_fast_kernel: ({"X": "*bf16", "stride_x": "i32", "T": "*i64", "W": "*fp32",
                                                "LSE": "*fp32", "G": "*fp8e5", "GT16": "*i16", "N": "i32", "V": "i32",
                                                "cap": "fp32", "a": "fp32", "b": "fp32", "g_scale": "fp32",
                                                "log2_g_scale": "fp32", "ignore_index": "i32"},
                                               {"HAS_CAP": True, "BLOCK_N": 64, "BLOCK_V": 128}),
    }
    for fn, (sig, consts) in kernels.items():
        consts = {**consts, **common}
        sig = {**sig, **{k: "constexpr" for k in consts}}
        aligned = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(sig.items())
                   if ty.startswith("*") or name in ("stride_x", "stride_g", "V", "N")}
        k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=aligned), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 8})
        assert ".local" not in k.asm["ptx"], fn.__name__
