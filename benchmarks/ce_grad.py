"""Time the fused head + loss kernels (speedgpt/model/kernels/softcap_ce.py) at the speedrun's shape,
one micro-step of 49152 x 50304 bf16 logits: the forward (logsumexp) kernel with either tanh, and the
e5m2 gradient kernel (the general one and the GPU's f16 one) over tile sizes and warps, each checked against the torch
reference on the first rows. A copy kernel with the same loads and stores but no math gives the
memory floor. Prints ms and the achieved bandwidth.

Usage: python benchmarks/ce_grad.py [--rows 49152] [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speedgpt.bench import cuda_ms  # noqa: E402
from speedgpt.model.kernels import softcap_ce as sce  # noqa: E402

CAP, G_SCALE, IGNORE = 15.0, 2.0 ** 15, -100


@triton.jit
def _copy_transpose_kernel(X, G, GT, N, V, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    row0 = tl.program_id(0) * BLOCK_N
    col0 = tl.program_id(1) * BLOCK_V
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_V)
    x = tl.load(X + row0.to(tl.int64) * V + col0 + (r[:, None] * V + c[None, :]))
    d = x.to(G.dtype.element_ty)
    tl.store(G + row0.to(tl.int64) * V + col0 + (r[:, None] * V + c[None, :]), d)
    tl.store(GT + col0.to(tl.int64) * N + row0 + (c[None, :] * N + r[:, None]), d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=49152)
    ap.add_argument("--quick", action="store_true", help="fewer gradient-kernel configs")
    ap.add_argument("--write-best", default="", help="write the fastest gradient-kernel config here (JSON)")
    args = ap.parse_args()
    N, V, vocab = args.rows, 50304, 50257
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, V, device="cuda", generator=g, dtype=torch.bfloat16) * 3
    x[: N // 64] *= 20
    x[:, vocab:] = -30
    t = torch.randint(0, vocab, (N,), device="cuda", generator=g)
    t[5::997] = IGNORE
    gb = x.numel() * 2 / 1e9

    # forward kernel: exact tanh formula vs the one-instruction approximation
    n_chk = 4096
    loss_ref, lse_ref = sce.reference_rows(x[:n_chk].float(), t[:n_chk], CAP, IGNORE)
    for tanh in ("exp", "approx"):
        sce.CONFIG["tanh"] = tanh
        ms = cuda_ms(lambda: sce._triton_fwd(x, t, CAP, IGNORE))
        loss, lse = sce._triton_fwd(x, t, CAP, IGNORE)
        err = (loss[:n_chk] - loss_ref).abs().max().item()
        mean_err = (loss[:n_chk].sum() - loss_ref.sum()).abs().item() / n_chk
        print(f"fwd kernel tanh={tanh:6s}: {ms:6.3f} ms ({gb / ms:.2f} TB/s read); per-row loss max abs err "
              f"{err:.1e}, mean-loss err {mean_err:.1e}")
    sce.CONFIG["tanh"] = "exp"
    _, lse = sce._triton_fwd(x, t, CAP, IGNORE)

    G = torch.empty(N, V, dtype=torch.float8_e5m2, device="cuda")
    GT = torch.empty(V, N, dtype=torch.float8_e5m2, device="cuda")
    moved = gb * 2  # bf16 read + two fp8 writes
    for bn, bv in ((32, 256), (64, 128), (128, 128), (128, 64)):
        ms = cuda_ms(lambda: _copy_transpose_kernel[(N // bn, V // bv if V % bv == 0 else V // bv)](
            x, G, GT, N, V, BLOCK_N=bn, BLOCK_V=bv, num_warps=8))
        print(f"floor: copy + cast + transpose, tile {bn}x{bv}: {ms:6.3f} ms ({moved / ms:.2f} TB/s)")

    g_ref = sce.reference_grad(x[:n_chk].float(), t[:n_chk], lse[:n_chk], torch.full_like(lse[:n_chk], G_SCALE),
                               CAP, IGNORE).to(torch.float8_e5m2).float()
    # (block_n, block_v, warps, fast kernel)
    configs = [(32, 256, 8, False)] + list(itertools.product((32, 64, 128), (128, 256), (8,), (True,))) + \
        [(32, 128, 4, True), (64, 128, 4, True), (64, 64, 4, True), (128, 64, 8, True)]
    if args.quick:
        configs = [(32, 256, 8, False), (32, 128, 8, True), (64, 128, 8, True)]
    results = []
    for bn, bv, warps, fast in configs:
        sce.CONFIG.update(fp8g_block_n=bn, fp8g_block_v=bv, fp8g_warps=warps, fp8g_fast=fast)
        try:
            ms = cuda_ms(lambda: sce._triton_fp8_grad(x, t, CAP, G_SCALE, IGNORE, torch.float8_e5m2)) \
                - cuda_ms(lambda: sce._triton_fwd(x, t, CAP, IGNORE))
            _, g8, gt8 = sce._triton_fp8_grad(x, t, CAP, G_SCALE, IGNORE, torch.float8_e5m2)
            err = ((g8[:n_chk].float() - g_ref).norm() / g_ref.norm()).item()
            same = torch.equal(gt8[:, :n_chk].T.float(), g8[:n_chk].float())
            # a config counts only if its output is right: G^T must be G transposed, bit for bit
            results.append((ms, bn, bv, warps, fast, "ok" if same and err < 1e-2 else "wrong"))
            print(f"grad kernel {bn:3d}x{bv:3d} warps {warps} fast {fast!s:5s}: {ms:6.3f} ms "
                  f"({moved / ms:.2f} TB/s); rel err vs reference e5m2 {err:.2e}; G^T == G.T: {same}", flush=True)
        except Exception as e:  # a config that does not compile (resources) is reported, not fatal
            print(f"grad kernel {bn}x{bv} warps {warps} fast {fast}: FAILED {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120]}")
    best = min(r for r in results if r[-1] == "ok")
    print(f"best gradient kernel: {best[1]}x{best[2]} warps {best[3]} fast {best[4]}: {best[0]:.3f} ms")
    if args.write_best:
        Path(args.write_best).write_text(json.dumps(
            {"fp8g_block_n": best[1], "fp8g_block_v": best[2], "fp8g_warps": best[3], "fp8g_fast": best[4]}))


if __name__ == "__main__":
    main()
