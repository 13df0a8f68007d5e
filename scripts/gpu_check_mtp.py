"""GPU check of the fused loss's multi-token prediction (K weighted targets per row) and affine logit map
(record #54's rescale), the paths speedrun-latest trains with (model.fused_mtp), at the speedrun's shapes:

1. the Triton kernels (model/kernels/softcap_ce.py) on bf16 logits against float64: per-row losses, the bf16
   gradient (softcap_cross_entropy's backward), the e5m2 gradient of the FP8 head (G, and G^T bit for bit);
2. the fused FP8 head + loss op (model/fp8_head.py) against an fp32 head with torch's loss: loss, dx, dW;
   compiled against eager;
3. time and peak memory per micro-step (forward + backward): the fused op against the unfused path each case
   took before (compiled): MTP as torch ops over fp32 logits; the rescale map through an unfused FP8 head,
   a bf16 map pass and the fused CE. speedrun-124m's own fused op (K = 1, no map) is the yardstick.

Cases: K = 3 and K = 2 at 32768 x 50304 (speedrun-latest's MTP stages, with its map), K = 1 with the map at
49152 x 50304 (its last stage).

Usage (repo root, CUDA + triton):  python scripts/gpu_check_mtp.py [--no-timing] [--no-compile] [--baseline FILE]
  --baseline: an earlier kernels/softcap_ce.py, e.g. from `git show b064051:speedgpt/model/kernels/softcap_ce.py`;
  one target without a map must give its results bit for bit (and its times).
Dry run of this script on CPU:     TRITON_INTERPRET=1 python scripts/gpu_check_mtp.py --dry-run-cpu
Exits 1 when a check fails, 2 when it cannot run."""

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
# The interpreter's e5m2 casts are not rounded to nearest (errors of tens of %, the same before MTP):
# in a dry run the e5m2 results are printed, not checked.
E5M2_NOTE = " (not checked: the interpreter's e5m2 casts)"


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL: {msg}", flush=True)


def expect(ok: bool, msg: str, e5m2: bool = False) -> None:
    if not ok and not (e5m2 and DEV == "cpu"):
        fail(msg)


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def case_list(dry: bool):
    """(name, timing rows, weights or None, (cap, scale, shift) of the map)."""
    from speedgpt.model.gates import rescale_as_affine_softcap

    rescale, plain = rescale_as_affine_softcap(), (15.0, 1.0, 0.0)
    rows = (64, 96) if dry else (32768, 49152)
    return [("K=3 + map", rows[0], [1.0, 0.5, 0.25], rescale),
            ("K=2 + map", rows[0], [1.0, 0.5], rescale),
            ("K=1 + map", rows[1], None, rescale),
            ("K=1 (124m)", rows[1], None, plain)]


def targets_for(n: int, k: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets (2, n/2) as the loader gives them, their rows for the fused op: (n, k), the row ends ignored)."""
    from speedgpt.model.mtp import target_rows

    g = torch.Generator(device=DEV).manual_seed(seed)
    t = torch.randint(0, vocab, (2, n // 2), device=DEV, generator=g)
    return t, target_rows(t, k, IGNORE) if k > 1 else t.reshape(-1)


def reference64(x, t_rows, w, cap, a, b, r0, r1):
    """float64 per-row loss and d(sum of rows)/dx for rows r0:r1 (weights w: (K,) or None)."""
    y = x[r0:r1].double() * a + b
    th = torch.tanh(y / cap)
    z = cap * th
    lse = torch.logsumexp(z, 1, keepdim=True)
    t = t_rows[r0:r1].reshape(r1 - r0, -1)
    valid = t != IGNORE
    wk = torch.where(valid, (w if w is not None else torch.ones(1, device=DEV)).double().reshape(1, -1), 0.0)
    idx = torch.where(valid, t, 0)
    loss = (wk * (lse - z.gather(1, idx))).sum(1)
    d = torch.exp(z - lse) * wk.sum(1, keepdim=True)
    d.scatter_add_(1, idx, -wk)
    return loss, d * (1 - th * th) * a


def check_kernels(name, n, vocab_cols, true_vocab, w, cap, a, b):
    """The kernels on bf16 logits shaped like the head's against float64."""
    from speedgpt.model.kernels import softcap_ce as sce

    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(n, vocab_cols, device=DEV, generator=g, dtype=torch.bfloat16) * 3
    x[: n // 64] *= 20  # far beyond the cap: it saturates
    x[:, true_vocab:] = -30
    k = 1 if w is None else len(w)
    _, t = targets_for(n, k, true_vocab, seed=1)
    wt = None if w is None else torch.tensor(w, device=DEV)
    loss_rows, _ = sce.softcap_ce_fwd(x, t, cap, IGNORE, False, wt, a, b)
    xl = x.clone().requires_grad_()
    sce.softcap_cross_entropy(xl, t, cap, "sum", weights=wt, scale=a, shift=b).backward()
    g_scale = 2.0 ** 15 / max(1.0, sum(w or [1.0]))  # as the FP8 head scales it
    _, g8, g8t = sce.softcap_ce_fp8_grad(x, t, cap, g_scale, weights=wt, scale=a, shift=b)
    worst_row, num, den, num8, den8, gmax, gerr = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    step = 1024
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        l64, g64 = reference64(x, t, wt, cap, a, b, r0, r1)
        worst_row = max(worst_row, (loss_rows[r0:r1].double() - l64).abs().max().item())
        d = xl.grad[r0:r1].double() - g64
        num, den = num + d.square().sum().item(), den + g64.square().sum().item()
        gerr, gmax = max(gerr, d.abs().max().item()), max(gmax, g64.abs().max().item())
        e8 = (g_scale * g64).to(torch.float8_e5m2).double()
        num8, den8 = num8 + (g8[r0:r1].double() - e8).square().sum().item(), den8 + e8.square().sum().item()
    same_t = torch.equal(g8t, g8.T.contiguous())
    print(f"[{name}] kernels {n} x {vocab_cols}: per-row loss max abs err {worst_row:.1e}; bf16 grad rel-norm err "
          f"{(num / den) ** 0.5:.1e}, max abs err / max |g| {gerr / gmax:.1e}; e5m2 grad rel-norm err vs the "
          f"e5m2-rounded reference {(num8 / den8) ** 0.5:.1e}; G^T == G.T bitwise: {same_t}"
          + (E5M2_NOTE if DEV == "cpu" else ""), flush=True)
    expect(worst_row < 1e-3, f"[{name}] per-row loss abs err {worst_row:.1e} >= 1e-3")
    expect((num / den) ** 0.5 < 5e-3, f"[{name}] bf16 grad rel-norm err {(num / den) ** 0.5:.1e} >= 5e-3")
    expect(gerr / gmax < 1e-2, f"[{name}] bf16 grad max err {gerr / gmax:.1e} >= 1e-2 of max |g|")
    expect((num8 / den8) ** 0.5 < 3e-2, f"[{name}] e5m2 grad rel-norm err {(num8 / den8) ** 0.5:.1e} >= 3e-2", True)
    expect(same_t, f"[{name}] G^T is not G transposed")


def head_inputs(n, dim, vocab_cols, true_vocab, k, seed=0):
    from speedgpt.model import fp8_head as fp8

    g = torch.Generator(device=DEV).manual_seed(seed)
    x = F.rms_norm(torch.randn(n, dim, device=DEV, generator=g), (dim,)).bfloat16()
    w = torch.randn(vocab_cols, dim, device=DEV, generator=g) * 0.2
    w[true_vocab:] = 0
    t_bt, t = targets_for(n, k, true_vocab, seed)
    return x, w, t_bt, t, dim ** 0.5 / fp8.E4M3_MAX, 24 / fp8.E4M3_MAX


def torch_loss(z, t_bt, wt, cap, a, b):
    """The model's torch loss on fp32 head logits z (N, V): the map, then mtp.py's loss or F.cross_entropy."""
    from speedgpt.model.mtp import multi_token_loss

    y = z * a + b
    z = cap * torch.tanh(y / cap)
    if wt is None:
        return F.cross_entropy(z, t_bt.reshape(-1))
    return multi_token_loss(z.view(*t_bt.shape, -1), t_bt, wt)


def check_head(name, n, dim, vocab_cols, true_vocab, w, cap, a, b, compile_too):
    """The fused FP8 head + loss against an fp32 head with torch's loss; compiled against eager."""
    from speedgpt.model import fp8_head as fp8

    wt = None if w is None else torch.tensor(w, device=DEV)
    x, W, t_bt, t, xs, ws = head_inputs(n, dim, vocab_cols, true_vocab, 1 if w is None else len(w))

    def fused(xx, WW):
        return fp8.fp8_head_cross_entropy(xx, WW, t, cap, xs, ws, weights=wt, scale=a, shift=b)

    xa, wa = x.clone().requires_grad_(), W.clone().requires_grad_()
    loss = fused(xa, wa)
    loss.backward()
    xr, wr = x.float().requires_grad_(), W.clone().requires_grad_()
    ref = torch_loss(xr @ wr.T, t_bt, wt, cap, a, b)
    ref.backward()
    e = (abs(loss.item() - ref.item()) / ref.item(), rel(xa.grad, xr.grad), rel(wa.grad, wr.grad))
    print(f"[{name}] fp8 head + loss {n} x {dim} x {vocab_cols}: loss {loss.item():.5f} vs fp32 {ref.item():.5f} "
          f"(rel {e[0]:.1e}), rel err dx {e[1]:.3f}, dW {e[2]:.3f}" + (E5M2_NOTE if DEV == "cpu" else ""), flush=True)
    expect(e[0] < 1e-2, f"[{name}] fused FP8 head + loss: loss rel err {e[0]:.1e} >= 1e-2")
    expect(e[1] < 0.1 and e[2] < 0.1, f"[{name}] fused FP8 head + loss: gradients off the fp32 reference: {e}", True)
    if compile_too:
        eager = (loss.detach(), xa.grad, wa.grad)
        xa.grad = wa.grad = None
        loss_c = torch.compile(fused, dynamic=False)(xa, wa)
        loss_c.backward()
        e_c = [rel(c, r) for c, r in zip((loss_c.detach(), xa.grad, wa.grad), eager)]
        print(f"[{name}] compiled vs eager: rel diff loss {e_c[0]:.1e}, dx {e_c[1]:.1e}, dW {e_c[2]:.1e}", flush=True)
        expect(max(e_c) < 1e-4, f"[{name}] compiled fused op differs from eager: {e_c}")


def measure(fn, x, W):
    """(ms per forward + backward, peak extra GiB) of fn(x, W)."""
    def run():
        fn(x, W).backward()
        x.grad = W.grad = None

    if DEV == "cpu":  # dry run: exercise the code, the numbers mean nothing
        import time
        run()
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e3, 0.0
    from speedgpt.bench import cuda_ms

    run()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ms = cuda_ms(run)
    return ms, (torch.cuda.max_memory_allocated() - base) / 2 ** 30


def time_case(name, n, dim, vocab_cols, true_vocab, w, cap, a, b, compile_too):
    from speedgpt.model import fp8_head as fp8
    from speedgpt.model.gates import rescale_for_softcap
    from speedgpt.model.kernels.softcap_ce import softcap_cross_entropy

    wt = None if w is None else torch.tensor(w, device=DEV)
    x, W, t_bt, t, xs, ws = head_inputs(n, dim, vocab_cols, true_vocab, 1 if w is None else len(w))
    x.requires_grad_()
    W.requires_grad_()
    maybe_compile = (lambda f: torch.compile(f, dynamic=False)) if compile_too else (lambda f: f)
    grad_scale = 1.0 / (n * fp8.E4M3_MAX)

    def fused(xx, WW):
        return fp8.fp8_head_cross_entropy(xx, WW, t, cap, xs, ws, weights=wt, scale=a, shift=b)

    if w is not None:  # before: MTP as torch ops over the FP8 head's fp32 logits
        def before(xx, WW):
            return torch_loss(fp8.fp8_linear(xx, WW, xs, ws, grad_scale).float(), t_bt, wt, cap, a, b)
    elif a != 1.0 or b != 0.0:  # before: unfused FP8 head, the map as a bf16 pass, then the fused CE
        def before(xx, WW):
            logits = rescale_for_softcap(fp8.fp8_linear(xx, WW, xs, ws, grad_scale))
            return softcap_cross_entropy(logits, t, cap, inplace_backward=True)
    else:
        before = None
    rows = []
    if before is not None:
        rows.append(("before (compiled)" if compile_too else "before (eager)", *measure(maybe_compile(before), x, W)))
    rows.append(("fused op (eager)", *measure(fused, x, W)))
    if compile_too:
        rows.append(("fused op (compiled)", *measure(maybe_compile(fused), x, W)))
    for label, ms, gib in rows:
        speed = f"  {rows[0][1] / ms:.2f}x" if before is not None and label != rows[0][0] else ""
        print(f"[{name}] {n} x {vocab_cols}: {label:22s} {ms:8.2f} ms  peak +{gib:5.1f} GiB{speed}", flush=True)
    return rows[-1][1]


def check_baseline(path: str, n: int, vocab_cols: int, true_vocab: int) -> None:
    """One target, no map: today's kernels against an earlier softcap_ce.py (e.g. `git show
    b064051:speedgpt/model/kernels/softcap_ce.py > /tmp/sce_before.py`), bit for bit, and their times."""
    import types

    from speedgpt.model.kernels import softcap_ce as now

    # Its kernels and launchers only: the custom ops after them would replace today's (same op names).
    source = Path(path).read_text().split("# Custom ops")[0]
    before = types.ModuleType("softcap_ce_before")
    before.__file__ = path
    exec(compile(source, path, "exec"), before.__dict__)
    before.CONFIG.update(now.CONFIG)
    g = torch.Generator(device=DEV).manual_seed(2)
    x = torch.randn(n, vocab_cols, device=DEV, generator=g, dtype=torch.bfloat16) * 3
    x[:, true_vocab:] = -30
    t = torch.randint(0, true_vocab, (n,), device=DEV, generator=g)
    t[5::997] = IGNORE
    dloss = torch.full((n,), 1.0 / n, device=DEV)
    runs = {}
    for label, m in (("before", before), ("now", now)):
        loss, lse = m._triton_fwd(x, t, 15.0, IGNORE)
        grad = m._triton_bwd(x, t, lse, dloss, 15.0, IGNORE, torch.empty_like(x))
        _, g8, g8t = m._triton_fp8_grad(x, t, 15.0, 2.0 ** 15, IGNORE, torch.float8_e5m2)
        outs = [loss, lse, grad, g8.view(torch.uint8), g8t.view(torch.uint8)]
        ms = []
        if DEV == "cuda":
            from speedgpt.bench import cuda_ms

            out = torch.empty_like(x)
            ms = [cuda_ms(lambda: m._triton_fwd(x, t, 15.0, IGNORE)),
                  cuda_ms(lambda: m._triton_bwd(x, t, lse, dloss, 15.0, IGNORE, out)),
                  cuda_ms(lambda: m._triton_fp8_grad(x, t, 15.0, 2.0 ** 15, IGNORE, torch.float8_e5m2))]
        runs[label] = (outs, ms)
    same = [torch.equal(a, b) for a, b in zip(runs["before"][0], runs["now"][0])]
    print(f"[K=1 vs {path}] {n} x {vocab_cols} bit for bit (loss, lse, bf16 grad, G, G^T): {same}", flush=True)
    if runs["now"][1]:
        print("[K=1] ms before / now: " + ", ".join(f"{k} {b:.3f} / {a:.3f}" for k, b, a in
                                                    zip(("fwd", "bwd", "fwd + e5m2 grad"), runs["before"][1],
                                                        runs["now"][1])), flush=True)
    expect(all(same), f"one target without a map differs from {path}: {same}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-rows", type=int, default=4096, help="rows of the float64 checks")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="time eager code only (no compile time)")
    ap.add_argument("--baseline", metavar="SOFTCAP_CE_PY", help="an earlier kernels/softcap_ce.py: one target, no "
                    "map must match it bit for bit (and time the same)")
    ap.add_argument("--dry-run-cpu", action="store_true", help="exercise this script on CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    global DEV
    dry = args.dry_run_cpu
    baseline = Path(args.baseline) if args.baseline else None
    if baseline and (not baseline.is_file() or "def _triton_fp8_grad" not in baseline.read_text()):
        print(f"gpu_check_mtp: --baseline {args.baseline} is no softcap_ce.py (write one with git show "
              f"REV:speedgpt/model/kernels/softcap_ce.py > FILE)")
        return 2
    if dry:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        print("gpu_check_mtp: no CUDA device; on CPU run it with TRITON_INTERPRET=1 ... --dry-run-cpu")
        return 2
    from speedgpt.model.kernels import softcap_ce as sce

    if not sce.available(DEV):
        print(f"gpu_check_mtp: the Triton kernels cannot run on {DEV} here (triton missing, or for a CPU dry run "
              f"TRITON_INTERPRET=1 unset)")
        return 2
    if dry:
        sce.CONFIG.update(fwd_block_v=128, bwd_block_v=64, fp8g_block_n=16, fp8g_block_v=64, fp8g_tanh="exp")
    name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (triton interpreter)"
    print(f"torch {torch.__version__}, {name}", flush=True)
    dim, cols, vocab = (64, 320, 300) if dry else (768, 50304, 50257)
    n_check = 64 if dry else args.check_rows
    compile_too = not (args.no_compile or dry)
    times = {}
    if args.baseline:
        try:
            check_baseline(args.baseline, 96 if dry else 49152, cols, vocab)
        except Exception:
            traceback.print_exc()
            fail("the baseline comparison raised")
    for case, rows, w, (cap, a, b) in case_list(dry):
        try:
            check_kernels(case, n_check, cols, vocab, w, cap, a, b)
            check_head(case, min(n_check, 8192), dim, cols, vocab, w, cap, a, b, compile_too)
            if DEV == "cuda":
                torch.cuda.empty_cache()
            if not args.no_timing:
                times[case] = time_case(case, rows, dim, cols, vocab, w, cap, a, b, compile_too)
                if DEV == "cuda":
                    torch.cuda.empty_cache()
        except Exception:
            traceback.print_exc()
            fail(f"[{case}] raised")
    if times:
        print("fused op per micro-step: " + ", ".join(f"{k} {v:.2f} ms" for k, v in times.items()))
    print("\nOK" if not FAILURES else f"\n{len(FAILURES)} failure(s): " + "; ".join(FAILURES))
    return 0 if not FAILURES else 1


if __name__ == "__main__":
    sys.exit(main())
