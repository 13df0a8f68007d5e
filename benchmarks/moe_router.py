"""The MoE's router and balancing over a short training run on the CPU: a small byte-level model
(vocabulary 256, the interpreter's own stdlib sources as text) with moe-d12's routing and optimizer
recipe (Muon + Adam lrs, schedule, Muon momentum warmup, expert-bias balancing after each step),
printing the MoE health figures (`model.moe.moe_health`) every few steps: the largest |router
logit|, the idlest and busiest expert's load over the mean, the spread of the balancing biases.

It is how moe-d12's divergence was traced (docs/experiments.md, "moe-d12's divergence"): a router
step moves a logit by up to router lr x ~0.8 x width, so at width 128 the lr 0.24 stands in for
moe-d12's old lr of 0.04 at width 768. Every run draws the same batches (paired).

Usage: python benchmarks/moe_router.py [--steps 300] [--every 25] [--width 128] [--section.key=value ...]
e.g.   python benchmarks/moe_router.py --optim.router_lr=0.24 --model.moe_bias_rate=0.001
"""

from __future__ import annotations

import argparse
import math
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from speedgpt.config import ConfigError, apply_overrides, load_preset
from speedgpt.model.build import build_model
from speedgpt.model.moe import balance_experts, moe_health
from speedgpt.optim.build import build_optimizers
from speedgpt.plan import RunPlan
from speedgpt.train.step_schedule import apply_hyperparameters


def stdlib_bytes() -> torch.Tensor:
    """The interpreter's top-level stdlib modules as one byte string: real text, no download."""
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return torch.from_numpy(np.frombuffer(b"".join(p.read_bytes() for p in paths), dtype=np.uint8).astype(np.int64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=25, help="print the health figures every this many steps")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--rows", type=int, default=8, help="rows of --seq bytes per step")
    ap.add_argument("--seq", type=int, default=128)
    args, overrides = ap.parse_known_args()
    torch.set_num_threads(1)
    try:
        cfg = apply_overrides(load_preset("moe-d12"), [
            "--model.depth=3", f"--model.model_dim={args.width}", "--model.head_dim=32", "--model.value_embeds=1",
            "--model.window_pattern=L", "--model.fused_ce=false", "--model.vocab_size=256",
            f"--data.seq_len={args.seq}", f"--train.steps={args.steps}", "--train.device=cpu", *overrides])
    except ConfigError as e:
        print(f"moe_router.py: {e}", file=sys.stderr)
        sys.exit(2)
    model = build_model(cfg.model, args.seq, "cpu", seed=cfg.train.seed)
    optimizers = build_optimizers(model, cfg.optim, torch.device("cpu"))
    optimizers.adam.register_step_post_hook(lambda *_: balance_experts(model, cfg.model.moe_bias_rate))
    plan = RunPlan.of(cfg)
    data = stdlib_bytes()
    g = torch.Generator().manual_seed(cfg.train.seed)
    print(f"width {args.width}, {args.rows} x {args.seq} bytes per step, router lr {cfg.optim.router_lr}, "
          f"bias rate {cfg.model.moe_bias_rate}, overrides {' '.join(overrides) or '-'}")
    losses, t0 = [], time.perf_counter()
    for step in range(args.steps):
        apply_hyperparameters(optimizers, plan, step)
        starts = torch.randint(0, len(data) - args.seq - 1, (args.rows,), generator=g)
        batch = torch.stack([data[s:s + args.seq + 1] for s in starts])
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        if cfg.optim.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizers.step(step)
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            print(f"step {step}: non-finite loss")
            break
        if (step + 1) % args.every == 0 or step + 1 == args.steps:
            h = moe_health(model)
            print(f"step {step + 1:4d} | loss {np.mean(losses[-args.every:]):.4f} | max |logit| "
                  f"{max(h['moe_logit_max']):6.1f} | load {min(h['moe_min_load']):.2f}-{max(h['moe_max_load']):.2f} "
                  f"| bias range {max(h['moe_bias_range']):.3f}")
    last = min(50, len(losses))
    print(f"final: mean loss of the last {last} steps {np.mean(losses[-last:]):.4f} after {len(losses)} steps "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
