"""GPU check: the fused FP8 head + loss (speedgpt::fp8_head_ce_fwd / _bwd, with and without MTP weights)
runs forward and backward without a host sync (torch.cuda.set_sync_debug_mode("error") raises on one).
The same check with the old scale helper (a tensor made from host data) must raise, or the check proves
nothing. Prints one line per case; exit 1 when the current code syncs.

    python scripts/gpu_check_syncs.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.model import fp8_head  # noqa: E402


def run_case(weights: bool) -> None:
    torch.manual_seed(0)
    n, d, v, k = 4096, 768, 50304, 3
    x = torch.nn.functional.rms_norm(torch.randn(n, d, device="cuda"), (d,)).bfloat16().requires_grad_(True)
    w = (torch.randn(v, d, device="cuda") * 0.02).requires_grad_(True)
    # MTP: K targets a row (the next K tokens) and K weights, as speedrun-latest's first stage has them
    t = torch.randint(0, v, (n, k) if weights else (n,), device="cuda")
    wt = torch.tensor([1.0, 0.5, 0.25], device="cuda") if weights else None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = fp8_head.fp8_head_cross_entropy(x, w, t, 15.0, 1.0, 0.875 / 448, weights=wt)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check_syncs.py: needs a CUDA GPU (torch's sync debug mode watches CUDA streams); run it on one")
        return 2
    current_ok = True
    for weights in (False, True):
        try:
            run_case(weights)
            print(f"current code, weights={weights}: no host sync")
        except RuntimeError as e:
            current_ok = False
            print(f"current code, weights={weights}: SYNC: {str(e).splitlines()[0][:160]}")
    fill = fp8_head._scale
    fp8_head._scale = lambda v, device: torch.tensor(v, dtype=torch.float32, device=device)  # the old helper
    try:
        run_case(False)
        print("old helper: no sync raised: the check cannot see syncs here")
        current_ok = False
    except RuntimeError as e:
        print(f"old helper: sync raised as expected ({str(e).splitlines()[0][:120]})")
    finally:
        fp8_head._scale = fill
    return 0 if current_ok else 1


if __name__ == "__main__":
    sys.exit(main())
