"""The collectives one training step issues on each rank, counted on the CPU (issue 34: optim.adam_every).

With optim.adam_every = 2 (speedrun-latest) Adam updates every second step. This counts, per rank and
step, the reduce-scatters, all-gathers and other collectives of a preset's own optimizers (its param
groups, Adam and Muon settings, as build_optimizers makes them) at a small width, on gloo ranks, over
steps 0-3 in the trainer's order (sync_embed_tying, Optimizers.begin_step where the tree has it, the
gradients, fold_tied_grads, step, zero_grad); and the MiB of Adam's gradients a reduce-scatter step
carries at the preset's own size:

    PYTHONPATH=. torchrun --standalone --nproc_per_node=4 benchmarks/dist_step_collectives.py \
        --preset speedrun-latest

The gradients are set directly (no forward or backward: the count does not depend on them), so every
bucket is launched by the optimizer's first wait, in the agreed order, as a backward's hooks would.
PYTHONPATH picks the tree: another checkout's (`git archive REV speedgpt | tar -x -C DIR`) counts its steps.
"""

from __future__ import annotations

import argparse
import collections

import torch
import torch.distributed as dist

from gloo_optimizers import add_preset_arguments, preset_optimizers, require_torchrun  # benchmarks/, beside it

# torch.distributed's tensor collectives, under their torch 2.13 names and the older ones
COLLECTIVES = ("reduce_scatter_single", "reduce_scatter_tensor", "all_gather_single", "all_gather_into_tensor",
               "all_reduce", "broadcast")


def count_collectives(counts: collections.Counter) -> None:
    """Wrap torch.distributed's collectives so that each call adds one to counts[name] (speedgpt.parallel.dist
    looks them up at every call)."""
    for name in COLLECTIVES:
        real = getattr(dist, name, None)
        if real is None:
            continue

        def wrapped(*args, _real=real, _name=name, **kwargs):
            short = _name.replace("_single", "").replace("_tensor", "").replace("_into", "")
            counts[short] += 1
            return _real(*args, **kwargs)

        setattr(dist, name, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_preset_arguments(ap, "speedrun-latest")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    require_torchrun(ap, __file__)
    if args.steps < 1:
        ap.error(f"--steps={args.steps}: count at least 1 step (e.g. --steps 4)")

    from speedgpt.model.build import build_model
    from speedgpt.optim.build import adam_groups

    full, cfg, model, opts = preset_optimizers(ap, args)
    rank, world = dist.get_rank(), dist.get_world_size()
    # What Adam's reduce-scatters carry a step at the preset's own size (parameters on the meta device)
    adam_mb = sum(p.numel() * p.element_size() for g in adam_groups(build_model(full.model, 64, "meta"), full.optim)
                  for p in g["params"]) / 2**20
    counts: collections.Counter = collections.Counter()
    count_collectives(counts)
    begin = getattr(opts, "begin_step", None)  # absent before issue 34's change: Adam reduced every step
    per_step = []
    for step in range(args.steps):
        model.sync_embed_tying(step, cfg.train.steps, opts)
        counts.clear()
        if begin is not None:
            begin(step)
        for p in model.parameters():  # added, as a backward adds into the sums begin_step handed back
            g = torch.randn(p.shape, generator=torch.Generator().manual_seed(100 * step + rank)).to(p.dtype)
            p.grad = g if p.grad is None else p.grad.add_(g)
        opts.fold_tied_grads()
        opts.step(step)
        model.zero_grad(set_to_none=True)
        due = opts.adam_due(step)
        per_step.append((step, due, dict(counts)))
    if rank == 0:
        n_adam = sum(len(g["params"]) for g in opts.adam.param_groups)
        defers = getattr(opts.adam, "defer_reduce", False)
        print(f"{args.preset} on {world} gloo ranks, optim.adam_every={cfg.optim.adam_every}: {n_adam} Adam parameters "
              f"({adam_mb:.0f} MiB of gradients a step at the preset's size), reduced "
              f"{'on Adam steps only' if defers else 'every step'}")
        for step, due, c in per_step:
            total = sum(c.values())
            print(f"step {step} (Adam {'updates' if due else 'waits'}): {total} collectives: "
                  + ", ".join(f"{name} {n}" for name, n in sorted(c.items())))
        mean = sum(sum(c.values()) for *_, c in per_step) / len(per_step)
        print(f"mean {mean:.1f} collectives a rank-step over {len(per_step)} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
