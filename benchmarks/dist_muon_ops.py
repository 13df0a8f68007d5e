"""The operations one DistMuon step issues on each rank, counted on the CPU (issue 34).

On 4 H100s the sharded Muon step was host-bound on whichever rank's host fell behind: its GPU idled
while the host issued the step's ~630 small kernels one by one (docs/distributed.md, wave 9). Every
aten operation that is not a view is roughly one kernel launch on a GPU, and the count does not depend
on the matrices' sizes, so this counts them per rank for a preset's own optimizers (its Muon matrices,
settings and param groups, as build_optimizers makes them) at a small width, on gloo:

    PYTHONPATH=. torchrun --standalone --nproc_per_node=4 benchmarks/dist_muon_ops.py --preset speedrun-124m

It prints one line per rank: operations (views excluded) in Muon's second step (the first also creates
the momentum buffers), the collectives among them (all-gathers: Adam's step, first, launches every
bucket's reduce-scatter, as the backward hooks would), and the orthogonalizations' batch sizes; then
rank 0's most frequent operations.
PYTHONPATH picks the tree: another checkout's (`git archive REV speedgpt | tar -x -C DIR`) counts its step.
"""

from __future__ import annotations

import argparse
import collections

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from gloo_optimizers import add_preset_arguments, preset_optimizers, require_torchrun  # benchmarks/, beside it


class CountOps(TorchDispatchMode):
    """Counts the aten operations that run under it, views left out (they launch nothing)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_preset_arguments(ap, "speedrun-124m")
    args = ap.parse_args()
    require_torchrun(ap, __file__)

    from speedgpt.optim import muon as muon_mod

    # The trainer's own optimizers: the preset's Muon settings and param groups (shape_transposed included).
    # Both step (they share one gradient sync, which resets after every bucket is released); Muon's is counted.
    _, cfg, model, opts = preset_optimizers(ap, args)
    rank, world = dist.get_rank(), dist.get_world_size()
    muon = opts.muon
    shapes = [tuple(p.shape) for group in muon.param_groups for p in group["params"]]
    batches = []
    real, muon_step = muon_mod.orthogonalize, muon.step

    def spy(G, *a, **kw):
        batches.append(G.shape[0])
        return real(G, *a, **kw)

    def counted_step(*a, **kw):
        with counter:
            return muon_step(*a, **kw)

    muon_mod.orthogonalize, muon.step = spy, counted_step
    for step in range(2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(100 * step + rank)).to(p.dtype)
        batches.clear()
        counter = CountOps()
        opts.step(step)
    muon_mod.orthogonalize = real
    total = sum(counter.ops.values())
    comm = sum(n for name, n in counter.ops.items() if "gather" in name or "scatter" in name)
    line = (f"rank {rank}: {total} operations in one DistMuon step ({comm} all-gathers), "
            f"{len(batches)} orthogonalization(s) of {batches} matrices; {len(shapes)} matrices on {world} ranks")
    lines = [None] * world
    dist.all_gather_object(lines, line)
    if rank == 0:
        print(f"{args.preset}: Muon matrices {collections.Counter(shapes)}")
        print("\n".join(lines))
        print("rank 0's most frequent:", ", ".join(f"{name} {n}" for name, n in counter.ops.most_common(12)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
