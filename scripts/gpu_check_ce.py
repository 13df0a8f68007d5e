"""GPU check of the fused softcapped cross-entropy (speedgpt/model/kernels/softcap_ce.py) at the
speedrun's shape: correctness against a float64 reference (loss and gradient), then timing of the
fused forward + backward against torch.compile of the unfused torch code, for a few launch configs.

Usage (from the repo root, on a CUDA machine with triton):
    python scripts/gpu_check_ce.py                  # 49152 x 50304 bf16, cap 15
    python scripts/gpu_check_ce.py --rows 8192      # quicker
Exits non-zero when a check fails or anything raises; prints the traceback."""

from __future__ import annotations

import argparse
import sys
import traceback

from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, installed or not

IGNORE = -100
DEV = "cuda"  # "cpu" only for a dry run of this script under TRITON_INTERPRET=1 (tiny shapes)
FAILURES: list[str] = []


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL: {msg}", flush=True)


def make_inputs(N, V, vocab, seed=0):
    """bf16 logits shaped like an lm_head's: mostly N(0, 3), a few rows far beyond the cap, the
    padded columns (>= vocab) strongly negative; some targets ignored."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(N, V, device=DEV, generator=g, dtype=torch.bfloat16) * 3
    x[: N // 64] *= 20  # |x| up to ~100: the cap saturates
    x[:, vocab:] = -30
    t = torch.randint(0, vocab, (N,), device=DEV, generator=g)
    t[5::997] = IGNORE
    return x, t


def reference64(x, t, cap, n_valid, r0, r1):
    """float64 per-row loss and the 'mean' gradient for rows r0:r1."""
    x64 = x[r0:r1].double()
    th = torch.tanh(x64 / cap)
    z = cap * th
    lse = torch.logsumexp(z, dim=1)
    tt = t[r0:r1]
    valid = tt != IGNORE
    idx = torch.where(valid, tt, 0).unsqueeze(1)
    loss = torch.where(valid, lse - z.gather(1, idx).squeeze(1), 0.0)
    p = torch.exp(z - lse.unsqueeze(1))
    p.scatter_add_(1, idx, -valid.double().unsqueeze(1))
    grad = p * (1 - th * th) * (valid.double() / n_valid).unsqueeze(1)
    return loss, grad


def check_correctness(x, t, cap, sce, compiled_ref):
    N = x.shape[0]
    n_valid = int((t != IGNORE).sum())
    # ours, through autograd (out of place)
    xl = x.detach().clone().requires_grad_()
    loss = sce.softcap_cross_entropy(xl, t, cap, "mean")
    loss.backward()
    ours_grad = xl.grad
    rows, _ = sce.softcap_ce_fwd(x, t, cap, IGNORE, False)
    # unfused, compiled (the baseline's own bf16 rounding, for scale)
    xr = x.detach().clone().requires_grad_()
    ref_loss_c = compiled_ref(xr, t)
    ref_loss_c.backward()
    ref_grad_c = xr.grad
    loss64_sum, worst_row, g_err, g_err_c, g_norm2, gd2, gd2_c, gmax = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    # elementwise: within one bf16 ulp (2^-7 relative) of float64, plus a floor far below the
    # largest gradient (|g| <= 1/n_valid) for entries where fp32's 1 - tanh^2 cancels
    bad, bad_c, floor = 0, 0, 1e-6 / n_valid
    step = 2048
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        l64, g64 = reference64(x, t, cap, n_valid, r0, r1)
        loss64_sum += l64.sum().item()
        worst_row = max(worst_row, (rows[r0:r1].double() - l64).abs().max().item())
        d = ours_grad[r0:r1].double() - g64
        dc = ref_grad_c[r0:r1].double() - g64
        g_err = max(g_err, d.abs().max().item())
        g_err_c = max(g_err_c, dc.abs().max().item())
        gmax = max(gmax, g64.abs().max().item())
        g_norm2 += g64.square().sum().item()
        gd2 += d.square().sum().item()
        gd2_c += dc.square().sum().item()
        lim = 2.0 ** -7 * g64.abs() + floor
        bad += int((d.abs() > lim).sum())
        bad_c += int((dc.abs() > lim).sum())
    loss64 = loss64_sum / n_valid
    rel_loss = abs(loss.item() - loss64) / abs(loss64)
    rel_loss_c = abs(ref_loss_c.item() - loss64) / abs(loss64)
    gn = g_norm2 ** 0.5
    print(f"loss: fused {loss.item():.8f}  compiled-ref {ref_loss_c.item():.8f}  float64 {loss64:.8f}")
    print(f"  rel err: fused {rel_loss:.2e}  compiled-ref {rel_loss_c:.2e};  worst per-row abs err (fused) {worst_row:.2e}")
    print(f"grad (bf16): rel-norm err fused {gd2 ** 0.5 / gn:.2e}  compiled-ref {gd2_c ** 0.5 / gn:.2e};  "
          f"max abs err / max |g|: fused {g_err / gmax:.2e}  compiled-ref {g_err_c / gmax:.2e}")
    print(f"  elements beyond one bf16 ulp of float64: fused {bad}  compiled-ref {bad_c}  (of {x.numel()})")
    if bad:
        fail(f"{bad} gradient elements beyond one bf16 ulp of float64")
    if not rel_loss < 1e-5:
        fail(f"loss rel err {rel_loss:.2e} >= 1e-5")
    if not worst_row < 1e-3:
        fail(f"per-row loss abs err {worst_row:.2e} >= 1e-3")
    # bf16 rounding alone: ~1.8e-3 rel-norm, <= 3.9e-3 max (the compiled reference shows the same)
    if not gd2 ** 0.5 / gn < 5e-3:
        fail(f"grad rel-norm err {gd2 ** 0.5 / gn:.2e} >= 5e-3")
    if not g_err / gmax < 1e-2:
        fail(f"grad max abs err / max |g| = {g_err / gmax:.2e} >= 1e-2")
    ign = t == IGNORE
    if ign.any() and not (ours_grad[ign] == 0).all():
        fail("ignored rows have a non-zero gradient")
    # in place: bitwise the out-of-place gradient
    _, lse = sce.softcap_ce_fwd(x, t, cap, IGNORE, True)
    buf = x.clone()
    dloss = torch.full((N,), 1.0 / n_valid, device=DEV)
    sce.softcap_ce_bwd_(buf, t, lse, dloss, cap, IGNORE)
    same = torch.equal(buf, ours_grad)
    print(f"in-place backward equals out-of-place: {same}")
    if not same:
        fail("in-place backward differs from out-of-place")
    # under torch.compile: same numbers, no graph break
    fn = torch.compile(lambda a, b: sce.softcap_cross_entropy(a, b, cap, "mean", IGNORE), fullgraph=True)
    xc = x.detach().clone().requires_grad_()
    lc = fn(xc, t)
    lc.backward()
    # the final sum / n_valid may reduce in another order when compiled: loss to 1e-6, grad bitwise
    ok = torch.allclose(lc, loss, rtol=1e-6, atol=0) and torch.equal(xc.grad, ours_grad)
    print(f"torch.compile(fullgraph) of the op equals eager: {ok} (loss diff {abs(lc.item() - loss.item()):.1e}, "
          f"grad bitwise {torch.equal(xc.grad, ours_grad)})")
    if not ok:
        fail("compiled op differs from eager")
    del xl, xr, xc, ours_grad, ref_grad_c, buf


def bench(fn, setup_grad=None):
    if DEV == "cpu":  # dry run: exercise the code, the numbers mean nothing
        import time
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench
    return do_bench(fn, warmup=50, rep=300, grad_to_none=setup_grad, return_mode="median")


def timing(x, t, cap, sce, compiled_ref, compiled_ref_fwd, configs):
    N, V = x.shape
    n_valid = int((t != IGNORE).sum())
    dloss = torch.full((N,), 1.0 / n_valid, device=DEV)
    print(f"\ntiming (median ms, triton.testing.do_bench), {N} x {V} {x.dtype}")
    xr = x.detach().clone().requires_grad_()
    ref_fb = bench(lambda: compiled_ref(xr, t).backward(), [xr])
    with torch.no_grad():
        ref_f = bench(lambda: compiled_ref_fwd(x, t))
    gb = x.numel() * x.element_size() / 1e9
    rows_default, _ = sce.softcap_ce_fwd(x, t, cap, IGNORE, False)
    print(f"{'variant':44s} {'fwd':>8s} {'bwd':>8s} {'fwd+bwd':>8s}  fwd GB/s  bwd GB/s  max|row loss - default|")
    print(f"{'torch.compile unfused (reference)':44s} {ref_f:8.3f} {ref_fb - ref_f:8.3f} {ref_fb:8.3f}")
    best = None
    saved = dict(sce.CONFIG)
    for cfg in configs:
        name = " ".join(f"{k.replace('_block_v', '').replace('_warps', 'W')}={v}" for k, v in cfg.items())
        try:
            sce.CONFIG.update(saved)
            sce.CONFIG.update(cfg)
            rows_cfg, lse = sce.softcap_ce_fwd(x, t, cap, IGNORE, False)
            dev = (rows_cfg - rows_default).abs().max().item()
            out = torch.empty_like(x)
            f = bench(lambda: sce._triton_fwd(x, t, cap, IGNORE))
            b = bench(lambda: sce._triton_bwd(x, t, lse, dloss, cap, IGNORE, out))
            print(f"{name[:44]:44s} {f:8.3f} {b:8.3f} {f + b:8.3f}  {gb / f * 1e3:8.0f}  {2 * gb / b * 1e3:8.0f}  {dev:.1e}")
            if cfg.get("tanh") != "approx" and (best is None or f + b < best[0]):  # approx: reported, not picked
                best = (f + b, cfg)
            del out
        except Exception:
            print(f"config {name} failed:")
            traceback.print_exc()
            fail(f"config {name} raised")
    sce.CONFIG.clear()
    sce.CONFIG.update(saved)
    if best is not None:
        sce.CONFIG.update(best[1])
        xl = x.detach().clone().requires_grad_()
        ours_fb = bench(lambda: sce.softcap_cross_entropy(xl, t, cap, "mean").backward(), [xl])
        # in place, the raw ops (what autograd runs, minus its ~10 us): the buffer's contents turn into
        # gradients after the first call, which changes nothing in the kernels' timing
        buf = x.clone()

        def inplace_step():
            _, lse_ = sce.softcap_ce_fwd(buf, t, cap, IGNORE, True)
            sce.softcap_ce_bwd_(buf, t, lse_, dloss, cap, IGNORE)

        inpl = bench(inplace_step)
        print(f"\nbest config {best[1]}")
        print(f"{'fused op via autograd, out-of-place grad':44s} {'':8s} {'':8s} {ours_fb:8.3f}")
        print(f"{'fused ops, in-place grad (no extra buffer)':44s} {'':8s} {'':8s} {inpl:8.3f}")
        print(f"\nspeedup vs compiled reference: {ref_fb / ours_fb:.2f}x  ({ref_fb - ours_fb:.3f} ms saved per micro-step, "
              f"x8 micro-steps = {8 * (ref_fb - ours_fb):.1f} ms per optimizer step)")
        print(f"HBM floor: H100 SXM (3.35 TB/s) fwd {gb / 3.35:.3f} ms, bwd {2 * gb / 3.35:.3f} ms; "
              f"H200 (4.8 TB/s) fwd {gb / 4.8:.3f} ms, bwd {2 * gb / 4.8:.3f} ms")
        print(f"suggested CONFIG for softcap_ce.py: {dict(sce.CONFIG)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=49152)
    ap.add_argument("--vocab", type=int, default=50304, help="padded vocab (columns)")
    ap.add_argument("--true-vocab", type=int, default=50257)
    ap.add_argument("--cap", type=float, default=15.0)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--configs", default="all", help="'default' times only the shipped CONFIG")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="check this script on CPU: TRITON_INTERPRET=1 ... --dry-run-cpu --rows 64 --vocab 1000 --true-vocab 990")
    args = ap.parse_args()
    global DEV
    if args.dry_run_cpu:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    try:
        import triton
        from speedgpt.model.kernels import softcap_ce as sce
    except Exception:
        traceback.print_exc()
        return 2
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (triton interpreter)"
    print(f"torch {torch.__version__}, triton {triton.__version__}, {name}")
    if not sce.available(DEV):
        print("softcap_ce kernels unavailable")
        return 2
    cap = args.cap

    def ref(a, b):
        z = a.float()
        z = cap * torch.tanh(z / cap)
        return F.cross_entropy(z, b, ignore_index=IGNORE)

    compiled_ref = torch.compile(ref)
    compiled_ref_fwd = torch.compile(ref)
    try:
        x, t = make_inputs(args.rows, args.vocab, args.true_vocab)
        check_correctness(x, t, cap, sce, compiled_ref)
        torch.cuda.empty_cache()
    except Exception:
        traceback.print_exc()
        fail("correctness check raised")
        return 1
    if not args.no_timing:
        configs = [
            {"fwd_block_v": 4096, "fwd_warps": 8, "bwd_block_v": 4096, "bwd_warps": 8},
            {"fwd_block_v": 8192, "fwd_warps": 16, "bwd_block_v": 8192, "bwd_warps": 16},
            {"fwd_block_v": 2048, "fwd_warps": 4, "bwd_block_v": 2048, "bwd_warps": 4},
            {"fwd_block_v": 8192, "fwd_warps": 8, "bwd_block_v": 4096, "bwd_warps": 4},
            {"fwd_block_v": 4096, "fwd_warps": 8, "bwd_block_v": 4096, "bwd_warps": 8, "tanh": "libdevice"},
            {"fwd_block_v": 4096, "fwd_warps": 8, "bwd_block_v": 4096, "bwd_warps": 8, "tanh": "approx"},
        ]
        if args.configs == "default" or DEV == "cpu":
            configs = [{}] if args.configs == "default" else [c for c in configs if c.get("tanh", "exp") == "exp"]
        try:
            timing(x, t, cap, sce, compiled_ref, compiled_ref_fwd, configs)
        except Exception:
            traceback.print_exc()
            fail("timing raised")
    print("\nOK" if not FAILURES else f"\n{len(FAILURES)} failure(s): " + "; ".join(FAILURES))
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
