"""Time the speedrun's MLP (RMSNorm -> fc -> ReLU² -> proj, forward + backward) at one micro-batch's
shape on the GPU: bf16 against FP8 with dynamic scales (model/fp8_linear.py; row-wise also with the
ReLU² kernels of model/kernels/relu2_fp8.py), each compiled, plus
the raw GEMMs (bf16 mm against torch._scaled_mm) and, optionally, bf16 under Inductor's max-autotune
(Triton GEMM templates with the ReLU² fused into their epilogues). Prints ms per call and the
relative errors against fp32.

Usage: python benchmarks/mlp.py [--tokens 49152] [--dim 768] [--autotune]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from gpu_check import rel  # this script's folder is on sys.path when run as a script
from speedgpt.bench import cuda_ms
from speedgpt.model.fp8_linear import fp8_linear_dynamic, fp8_relu2_mlp


def mlp(x, w1, w2, mode: str):
    x = F.rms_norm(x, (x.size(-1),))
    if mode == "fused":
        return fp8_relu2_mlp(x, w1, w2)
    if mode == "bf16":
        h = F.linear(x, w1.bfloat16())
        return F.linear(F.relu(h).square(), w2.bfloat16())
    h = fp8_linear_dynamic(x, w1, mode)
    return fp8_linear_dynamic(F.relu(h).square(), w2, mode)


def gemms(N: int, D: int, H: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    print(f"raw GEMMs, M = {N} tokens (ms; TFLOP/s):")
    for K, Nout in ((D, H), (H, D)):
        a = torch.randn(N, K, device="cuda", generator=g).bfloat16()
        b = torch.randn(Nout, K, device="cuda", generator=g).bfloat16()
        flops = 2 * N * K * Nout
        bt = b.t().contiguous()  # B row-major (K, N): the input-gradient layout
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        a5 = a.to(torch.float8_e5m2)
        one = torch.ones((), device="cuda")
        ra, rb = torch.ones(N, 1, device="cuda"), torch.ones(1, Nout, device="cuda")
        rows = []
        for name, fn in (("bf16 x @ w.T", lambda: a @ b.t()),
                         ("bf16 g @ w", lambda: a @ bt),
                         ("fp8 tensorwise e4m3", lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                                          out_dtype=torch.bfloat16, use_fast_accum=True)),
                         ("fp8 tensorwise e5m2 x e4m3", lambda: torch._scaled_mm(a5, b8.t(), scale_a=one, scale_b=one,
                                                                                 out_dtype=torch.bfloat16)),
                         ("fp8 rowwise e4m3 fast", lambda: torch._scaled_mm(a8, b8.t(), scale_a=ra, scale_b=rb,
                                                                            out_dtype=torch.bfloat16, use_fast_accum=True)),
                         ("fp8 rowwise e4m3", lambda: torch._scaled_mm(a8, b8.t(), scale_a=ra, scale_b=rb,
                                                                       out_dtype=torch.bfloat16))):
            try:
                t = cuda_ms(fn, iters=20, warmup=3)
                rows.append(f"    {name:30s} {t:7.3f} ms {flops / t / 1e9:7.0f}")
            except RuntimeError as e:
                rows.append(f"    {name:30s} FAILED: {str(e).splitlines()[0][:100]}")
        print(f"  K={K} N={Nout}")
        print("\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=49152)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--autotune", action="store_true", help="also bf16 under mode=max-autotune-no-cudagraphs")
    ap.add_argument("--profile", type=int, default=0, help="print the N costliest GPU kernels of each variant")
    ap.add_argument("--skip-gemms", action="store_true")
    args = ap.parse_args()
    N, D = args.tokens, args.dim
    H = 4 * D
    torch.manual_seed(0)
    if not args.skip_gemms:
        gemms(N, D, H)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, D, device="cuda", generator=g).bfloat16()
    w1 = (torch.rand(H, D, device="cuda", generator=g) * 2 - 1) * (3 ** 0.5 * 0.5 * D ** -0.5)
    w2 = torch.randn(D, H, device="cuda", generator=g) * 0.02
    gout = torch.randn(N, D, device="cuda", generator=g).bfloat16()

    xr, w1r, w2r = (t.detach().float().requires_grad_() for t in (x, w1, w2))
    F.linear(F.relu(F.linear(F.rms_norm(xr, (D,)), w1r)).square(), w2r).backward(gout.float())
    ref = (F.linear(F.relu(F.linear(F.rms_norm(xr.detach(), (D,)), w1r.detach())).square(), w2r.detach()),
           xr.grad, w1r.grad, w2r.grad)

    variants = [("bf16", "bf16", {}), ("fp8 rowwise", "rowwise", {}), ("fp8 rowwise, fused act", "fused", {}),
                ("fp8 tensorwise", "tensorwise", {})]
    if args.autotune:
        variants.append(("bf16 max-autotune", "bf16", {"mode": "max-autotune-no-cudagraphs"}))
    print(f"\nMLP forward + backward, {N} x {D} -> {H} -> {D} (compiled):")
    base = None
    for name, mode, opts in variants:
        torch._dynamo.reset()
        fn = torch.compile(lambda a, b, c, m=mode: mlp(a, b, c, m), dynamic=False, **opts)
        xi, w1i, w2i = (t.detach().clone().requires_grad_() for t in (x, w1, w2))

        def step():
            fn(xi, w1i, w2i).backward(gout)

        t = cuda_ms(step, iters=10, warmup=3)
        xi.grad = w1i.grad = w2i.grad = None
        out = fn(xi, w1i, w2i)
        out.backward(gout)
        errs = [rel(out, ref[0]), rel(xi.grad, ref[1]), rel(w1i.grad, ref[2]), rel(w2i.grad, ref[3])]
        base = base or t
        print(f"  {name:20s} {t:7.3f} ms  ({base / t:.2f}x)  rel err out {errs[0]:.1e} dx {errs[1]:.1e} "
              f"dw1 {errs[2]:.1e} dw2 {errs[3]:.1e}", flush=True)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(4):
                    step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.profile, max_name_column_width=90))


if __name__ == "__main__":
    main()
