"""How long Triton takes to build a rotary-like kernel that computes cos and sin per element, against one that reads
them from tables (issue 33; docs/experiments.md, "YaRN's tables made outside the graph").

Both kernels rotate BLOCK float32 elements a program: x * cos + x * sin, with the angle = position x frequency.
The table kernel loads cos and sin; the computing kernel calls Triton's cos and sin, whose range reduction is inlined
for every element a thread holds. Built for an sm_90 target (H100) on the CPU: Triton's compiler and ptxas run without
a GPU. Each kernel is built in a new Triton cache folder, so nothing is reused.

Usage: python benchmarks/triton_trig_build.py [--block 8192] [--warps 4]   (needs a torch with Triton: the GPU image's)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--block", type=int, default=8192, help="elements a program (a power of 2)")
    ap.add_argument("--warps", type=int, default=4)
    args = ap.parse_args()
    if args.block < 128 or args.block & (args.block - 1):
        ap.error(f"--block {args.block}: give a power of 2 of at least 128")
    try:
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:
        sys.exit("triton_trig_build.py: this Python has no Triton; run it with a CUDA build of torch (it ships Triton; "
                 "the GPU image's does)")

    @triton.jit
    def reads_tables(x_ptr, cos_ptr, sin_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        x = tl.load(x_ptr + offs, keep)
        cos = tl.load(cos_ptr + offs % 64, keep)
        sin = tl.load(sin_ptr + offs % 64, keep)
        tl.store(y_ptr + offs, x * cos + x * sin, keep)

    @triton.jit
    def computes_trig(x_ptr, freq_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        x = tl.load(x_ptr + offs, keep)
        angle = (offs // 64).to(tl.float32) * tl.load(freq_ptr + offs % 64, keep)
        tl.store(y_ptr + offs, x * tl.cos(angle) + x * tl.sin(angle), keep)

    kernels = {
        "reads cos and sin": (reads_tables, {"x_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
                                             "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}),
        "computes cos and sin": (computes_trig, {"x_ptr": "*fp32", "freq_ptr": "*fp32", "y_ptr": "*fp32",
                                                 "n": "i32", "BLOCK": "constexpr"}),
    }
    per_thread = args.block // (32 * args.warps)
    print(f"triton {triton.__version__}, sm_90 target, BLOCK {args.block}, {args.warps} warps "
          f"({per_thread} elements a thread)")
    print(f"{'kernel':<22} {'build s':>8} {'PTX lines':>10} {'cubin bytes':>12}")

    def build(fn, signature, block):
        return triton.compile(ASTSource(fn=fn, signature=signature, constexprs={"BLOCK": block}),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": args.warps})

    with tempfile.TemporaryDirectory(prefix="triton-trig-") as cache:  # Triton's one-time start, not timed
        os.environ["TRITON_CACHE_DIR"] = cache
        build(*kernels["reads cos and sin"], 128)
    for name, (fn, signature) in kernels.items():
        with tempfile.TemporaryDirectory(prefix="triton-trig-") as cache:
            os.environ["TRITON_CACHE_DIR"] = cache
            t0 = time.perf_counter()
            built = build(fn, signature, args.block)
            took = time.perf_counter() - t0
        print(f"{name:<22} {took:>8.2f} {built.asm['ptx'].count(chr(10)):>10,} {len(built.asm['cubin']):>12,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
