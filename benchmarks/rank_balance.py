"""Does the data make one rank's step slower? Each rank's attention work per step, on the CPU.

    python benchmarks/rank_balance.py --preset speedrun-124m --data /tmp/pyc [--world 4] [--steps 100]
        [--train-steps 300] [--bench 20] [override ...]

Runs the real training loaders of every rank (train/build.py `train_loader`, at the preset's stage
batching on --world ranks) over the first --steps optimizer steps and builds the model's own
FlexAttention block masks (model/attention.py `build_context`, the step's windows from the run's
plan) for every row a rank trains in the step. A rank's work in a step is the 128 x 128 blocks its
masks compute, full and partial, summed over its rows and its attention layers (times each layer's
heads: paired-head layers run half the heads over a doubled sequence). Prints per step the max over
ranks / mean, which rank is heaviest, each rank's mean share, and the milliseconds the step waits
for its heaviest rank when --attn-ms (attention's GPU time per step of one rank, from `bench
--profile`) is spread over the blocks of the profiled steps (--calibrate: schedule positions).

--bench N also replays `speedgpt bench --steps N`: its N timed steps take the loader's first N
batches at windows spread over the run (bench.timed_steps), and its two profiled steps the next two.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.bench import timed_steps  # noqa: E402
from speedgpt.config.errors import ConfigError  # noqa: E402
from speedgpt.config.overrides import resolve  # noqa: E402
from speedgpt.data.shards import find_shards  # noqa: E402
from speedgpt.model.attention import build_context  # noqa: E402
from speedgpt.model.build import model_from_config  # noqa: E402
from speedgpt.parallel.dist import DistInfo  # noqa: E402
from speedgpt.planner import plan_run  # noqa: E402
from speedgpt.train.build import train_loader  # noqa: E402


def layer_heads(model) -> Counter:
    """mask key -> heads that attend through it, summed over the model's attention layers."""
    heads: Counter = Counter()
    for block in model.blocks:
        if block.attn is not None:
            heads[block.attn.mask_key] += block.attn.num_heads // (2 if block.attn.paired else 1)
    return heads


def row_blocks(inputs_BT: torch.Tensor, windows, heads: Counter, bos_id: int, block: int,
               partial_weight: float = 1.0) -> list[float]:
    """Per row: attention blocks computed (full + partial_weight x partial) x heads, summed over layers."""
    ctx = build_context(inputs_BT, backend="flex", windows=windows, doc_masking=True, bos_id=bos_id,
                        patterns=list(heads), block=block)
    out = torch.zeros(inputs_BT.size(0), dtype=torch.float64)
    for key, n in heads.items():
        mask = ctx.masks[key]
        partial = mask.kv_num_blocks.sum(dim=(1, 2)).double()
        out += n * (partial_weight * partial + mask.full_kv_num_blocks.sum(dim=(1, 2)).double())
    return out.tolist()


class RankWork:
    """Every rank's loader of one run; `step(windows, s)`: each rank's blocks in optimizer step s."""

    def __init__(self, cfg, world: int, partial_weight: float = 1.0):
        self.partial_weight = partial_weight
        self.plan = plan_run(cfg, world)
        cfg = self.plan.cfg
        files = find_shards(cfg.data.train_files, "train")
        self.loaders = [train_loader(cfg, files, DistInfo(rank=r, world_size=world), self.plan.micro_batch,
                                     self.plan.grad_accum) for r in range(world)]
        for loader in self.loaders:
            loader.close()  # no prefetch: every batch is built once, in order
        model = model_from_config(cfg, "meta")
        self.heads, self.block, self.bos = layer_heads(model), model.runtime.window_block, cfg.model.bos_id

    def step(self, s: int, windows=None) -> list[float]:
        stage = self.plan.stage_at(s)
        rows, accum = self.plan.stage_batch(stage)
        windows = windows or self.plan.windows_at(s)
        work = [0.0] * len(self.loaders)
        for loader in self.loaders:
            loader.set_grad_accum(accum)
        for _ in range(accum):
            for r, loader in enumerate(self.loaders):
                inputs, _ = loader.next_batch(rows, stage.seq_len, stage.max_doc_len)
                work[r] += sum(row_blocks(inputs, windows, self.heads, self.bos, self.block,
                                                self.partial_weight))
        return work


def summarize(name: str, per_step: list[list[float]], ms_per_block: float | None) -> None:
    world = len(per_step[0])
    ratio = [max(w) / statistics.mean(w) for w in per_step]
    heaviest = Counter(max(range(world), key=w.__getitem__) if max(w) > min(w) else "tie" for w in per_step)
    share = [statistics.mean(w[r] / statistics.mean(w) for w in per_step) for r in range(world)]
    print(f"{name}: {len(per_step)} steps, {world} ranks")
    print(f"  max/mean per step: mean {statistics.mean(ratio):.4f}, median {statistics.median(ratio):.4f}, "
          f"max {max(ratio):.4f}")
    print("  heaviest rank (steps): " + ", ".join(f"r{r} {heaviest[r]}" for r in range(world))
          + f", all equal {heaviest['tie']}")
    print("  rank's work / step mean, averaged: " + ", ".join(f"r{r} {x:.4f}" for r, x in enumerate(share)))
    if ms_per_block:
        lost = [(max(w) - statistics.mean(w)) * ms_per_block for w in per_step]
        waits = [statistics.mean((max(w) - w[r]) * ms_per_block for w in per_step) for r in range(world)]
        print(f"  ms the step waits for its heaviest rank (max - mean): mean {statistics.mean(lost):.2f}, "
              f"median {statistics.median(lost):.2f}, max {max(lost):.2f}")
        print("  each rank's mean wait for the heaviest (ms): "
              + ", ".join(f"r{r} {x:.2f}" for r, x in enumerate(waits)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="speedrun-124m")
    p.add_argument("--data", required=True, help="training shards (directory or glob)")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=100, help="optimizer steps to measure from the run's start")
    p.add_argument("--train-steps", type=int, default=300, help="the run's steps (its window schedule)")
    p.add_argument("--bench", type=int, default=0, help="also replay `bench --steps N` (its windows, its data)")
    p.add_argument("--attn-ms", type=float, default=36.9, help="flex attention GPU ms per step of one rank")
    p.add_argument("--calibrate", default=None, help="schedule positions (of the preset's own steps) of the "
                   "profiled steps --attn-ms was measured at (default: bench's, its last two timed positions); "
                   "they take bench's batches N and N+1, as `bench --profile` does")
    p.add_argument("--partial-weight", type=float, default=1.0,
                   help="a partial block's cost in full blocks (it evaluates the mask per element)")
    p.add_argument("overrides", nargs="*", help="--section.key=value")
    a = p.parse_args()
    try:
        measure(a)
    except (ConfigError, FileNotFoundError, ValueError) as e:  # bad preset, override, data path or world size
        print(f"rank_balance: {e}", file=sys.stderr)
        return 2
    return 0


def measure(a: argparse.Namespace) -> None:
    base = [f"--data.train_files={a.data}", "--train.compile=false", *a.overrides]

    ms_per_block = None
    if a.bench:
        work = RankWork(resolve(a.preset, overrides=base), a.world, a.partial_weight)
        total = work.plan.steps
        positions = timed_steps(total, a.bench, None, work.plan.cfg.optim.adam_every)
        timed = [work.step(s) for s in positions]
        profiled = [int(x) for x in a.calibrate.split(",")] if a.calibrate else positions[-2:]
        calib = [work.step(s) for s in profiled]
        ms_per_block = a.attn_ms / statistics.mean(statistics.mean(w) for w in calib)
        print(f"calibration: {a.attn_ms} ms of flex attention per rank-step = "
              f"{statistics.mean(statistics.mean(w) for w in calib):,.0f} head-blocks "
              f"(bench's profiled batches at steps {profiled} of {total}): {ms_per_block * 1e6:.1f} ns a head-block")
        summarize(f"{a.preset} `bench --steps {a.bench}` (first {a.bench} batches, windows of steps "
                  f"{positions[0]}..{positions[-1]} of {total})", timed, ms_per_block)
    work = RankWork(resolve(a.preset, overrides=[*base, f"--train.steps={a.train_steps}"]), a.world,
                    a.partial_weight)
    per_step = [work.step(s) for s in range(a.steps)]
    summarize(f"{a.preset} training, steps 0..{a.steps - 1} of {a.train_steps}", per_step, ms_per_block)


if __name__ == "__main__":
    sys.exit(main())
