"""Time compiled FlexAttention forward + backward at the speedrun's shape (one 48K-token row, 6 heads
of 128, document-causal sliding windows in blocks of 128) for several FlexAttention kernel_options,
to choose the kernel_options that speedgpt/model/attention.py's flex_attention_fused would pass
(today it passes none: FlexAttention's defaults). GPU only.

Usage: python benchmarks/flex.py [--T 49152] [--doc-len 7000] [--windows 1792 896]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speedgpt.bench import cuda_ms  # noqa: E402

CANDIDATES = {
    "default": {},
    "rows_safe": {"ROWS_GUARANTEED_SAFE": True},
    "tma": {"USE_TMA": True},
    "rows_safe+tma": {"ROWS_GUARANTEED_SAFE": True, "USE_TMA": True},
    "fwd 128x128 w8 s2": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    "fwd 128x64 w8 s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    "bwd 64x128/128x64 w8": {"BLOCK_M1": 64, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 64, "num_warps": 8},
    "bwd 32x128/128x32 w4": {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32, "num_warps": 4},
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, default=49152)
    p.add_argument("--doc-len", type=int, default=7000, help="mean document length in tokens")
    p.add_argument("--windows", type=int, nargs="+", default=[1792, 896])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--only", nargs="*", default=None, help="candidate names to run")
    args = p.parse_args()
    from torch.nn.attention.flex_attention import flex_attention

    from speedgpt.model.attention import FlexMasks, document_ids

    g = torch.Generator(device="cuda").manual_seed(0)
    T, H, D = args.T, 6, 128
    tokens = torch.randint(0, 50000, (1, T), device="cuda", generator=g)
    starts = torch.randint(0, T, (max(1, T // args.doc_len),), device="cuda", generator=g)
    tokens[0, starts] = 50256
    tokens[0, 0] = 50256
    masks = FlexMasks(document_ids(tokens, 50256), 128)
    q, k, v = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    gout = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    print(torch.__version__, torch.cuda.get_device_name(), f"T={T} H={H} D={D} windows={args.windows}", flush=True)
    base = None
    for name, opts in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        fn = torch.compile(lambda a, b, c, bm: flex_attention(a, b, c, block_mask=bm, scale=0.12,
                                                              kernel_options=opts or None), dynamic=False)
        try:
            times, outs = [], []
            for window in args.windows:
                bm = masks.block_mask(torch.tensor(window // 128, device="cuda") * 128)
                last = []

                def fwd_bwd():
                    out = fn(q, k, v, bm)
                    out.backward(gout)
                    last[:] = [out]

                times.append(cuda_ms(fwd_bwd, iters=args.reps, warmup=2))  # the warmup compiles
                outs.append(last[0].detach().float())
                q.grad = k.grad = v.grad = None
            if base is None:
                base = (times, outs)
            err = max(((o - b).norm() / b.norm()).item() for o, b in zip(outs, base[1]))
            print(f"{name:24s} " + "  ".join(f"w{w}: {t:6.3f} ms" for w, t in zip(args.windows, times))
                  + f"  ({base[0][0] / times[0]:.3f}x at w{args.windows[0]}; out diff vs default {err:.1e})",
                  flush=True)
        except Exception as e:
            print(f"{name:24s} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
