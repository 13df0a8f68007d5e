"""`speedgpt bench`: throughput, MFU, step time, peak memory and compile time of a config.

Runs the real training step (same data, same seed) after the warmup-then-reset, timed with CUDA
events over a window of steps, with no evaluation or checkpoints in between. `--ab` runs a second
config (the same plus other overrides) in the same process for an A/B comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from .config import Config, apply_overrides, default_preset, resolve


def measure_matmul_peak(device: torch.device, n: int = 8192, iters: int = 20) -> float:
    """Achievable bf16 FLOP/s on this device: an n^3 matmul on random data, median of timed runs."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times)


def cuda_ms(fn, iters: int = 10, warmup: int = 1) -> float:
    """Mean milliseconds per call of fn's GPU work, by CUDA events around `iters` back-to-back calls
    after `warmup` untimed ones (the first call compiles and autotunes)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


# GPU kernels by what they do, matched on kernel names (first match wins); the rest is "other".
KERNEL_CATEGORIES = (
    ("flex attention", ("flex", "attention")),
    ("cross-entropy (ours)", ("softcap_ce",)),
    ("relu² + fp8 casts (ours)", ("relu2_fp8",)),
    # cuBLAS names its FP8 kernels nvjet_sm90_qq* / qr* (bf16: nvjet_sm90_tst*)
    ("fp8 matmul", ("f8", "fp8", "e4m3", "e5m2", "sm90_qq", "sm90_qr", "sm90_rq")),
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "wgmma")),
    ("triton templates (flex)", ("triton_tem",)),
    ("nccl", ("nccl",)),
    ("memcpy/memset", ("memcpy", "memset")),
    ("triton fused (inductor)", ("triton_",)),
    ("aten elementwise/reduce", ("elementwise", "reduce", "vectorized")),
)


def kernel_category(name: str) -> str:
    low = name.lower()
    for category, keys in KERNEL_CATEGORIES:
        if any(k in low for k in keys):
            return category
    return "other"


def print_kernel_categories(prof, steps: int, step_ms: float | None = None) -> None:
    """Per-step GPU time by kernel category, from the profiler's device-side kernel events."""
    from collections import Counter

    totals: Counter = Counter()
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            totals[kernel_category(evt.name)] += evt.device_time_total / 1e3 / steps
    print(f"GPU time per step by kernel category (ms, {steps} profiled steps):")
    for category, ms in totals.most_common():
        print(f"  {category:28s} {ms:9.1f}")
    print(f"  {'total':28s} {sum(totals.values()):9.1f}")
    if step_ms is not None:  # the same schedule steps timed without the profiler: the rest is GPU idle
        print(f"  {'step time, unprofiled':28s} {step_ms:9.1f}  (GPU idle ~{step_ms - sum(totals.values()):.1f})")


def bench_config(cfg: Config, steps: int, at_step: int | None = None, profile: int = 0) -> dict:
    """Time `steps` training steps of `cfg` after its compile/warmup; returns the figures."""
    from .train.loop import Trainer

    # Each config compiles its own graph: dynamo would otherwise reuse the first config's compiled
    # model for a second one whose differences it does not guard on (an Inductor setting, say).
    torch._dynamo.reset()
    # log_every=1 arms the gradient-sync timers (multi-rank) on every step.
    cfg = apply_overrides(cfg, ["--run.report=false", "--run.sample_tokens=0", "--train.log_every=1"])
    trainer = Trainer(cfg, run_dir=Path(tempfile.mkdtemp(prefix="speedgpt-bench-")), quiet=True)
    cfg = trainer.cfg  # with a budget's derived steps and batch
    t0 = time.perf_counter()
    trainer.setup()
    setup_s = time.perf_counter() - t0
    warm_s = trainer.warmup_then_reset()
    device = trainer.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    total = cfg.train.steps
    # Time steps spread over the schedule: the attention window (and so the cost) grows with progress.
    schedule_steps = timed_steps(total, steps, at_step, cfg.optim.adam_every)
    step_times, comm_ms, loader_s = time_steps(trainer, schedule_steps)
    if profile and cuda:
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for s in schedule_steps[-2:]:
                trainer.train_step(s)
            torch.cuda.synchronize(device)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=profile))
        print_kernel_categories(prof, steps=2, step_ms=statistics.mean(step_times[-2:]) * 1e3)
    trainer.metrics.close()
    mean_s = statistics.mean(step_times)
    work = timed_work(trainer.plan, schedule_steps, trainer.progress.flops_per_token)
    tokens_per_step = work["tokens"] / len(schedule_steps)
    tok_s = tokens_per_step / mean_s
    flops = work["flops"] / work["tokens"]  # per token, averaged over the timed steps' tokens
    out = {
        "device": str(device) if not cuda else torch.cuda.get_device_name(device),
        "timed_stages": work["stages"],
        "tokens_per_step": tokens_per_step,
        "step_ms_mean": mean_s * 1e3,
        "step_ms_median": statistics.median(step_times) * 1e3,
        "tok_per_s": tok_s,
        "model_tflops_per_s": tok_s * flops / 1e12,
        "setup_s": setup_s,
        "compile_warmup_s": warm_s,
        "loader_ms_per_step": loader_s / len(step_times) * 1e3,
        "world_size": trainer.dist.world_size,
        "strategy": trainer.strategy,
        "memory_estimate_gib": trainer.memory_estimate.total / 2**30,  # to set against the measured peak
        "attn_backend": trainer.model.runtime.attn_backend,
        "fp8_head": trainer.model.runtime.fp8_head,
    }
    if comm_ms:
        out["comm_wait_ms_per_step"] = statistics.mean(comm_ms)
        out["comm_exposed_frac"] = statistics.mean(comm_ms) / 1e3 / mean_s
    if trainer.peak:
        out["mfu_datasheet"] = tok_s * flops / (trainer.peak * trainer.dist.world_size)
    if cuda:
        out["peak_mem_alloc_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        out["peak_mem_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
    del trainer
    if cuda:
        torch.cuda.empty_cache()
    return out


def timed_work(plan, schedule_steps: list[int], flops_per_token) -> dict:
    """What the timed steps computed: {"tokens", "flops", "stages"}. Each step counts at its own stage's
    batch and row length (a stage table's stages differ in both, and attention's FLOPs per token grow
    with the row length), with `flops_per_token(seq_len)` (progress.py's, which the run's logged MFU
    uses too); "stages" says which stages were timed, for the printout."""
    tokens = flops = 0.0
    timed: dict[int, int] = {}  # stage index -> timed steps in it
    for s in schedule_steps:
        stage = plan.stage_at(s)
        tokens += stage.batch_tokens
        flops += stage.batch_tokens * flops_per_token(stage.seq_len)
        timed[stage.index] = timed.get(stage.index, 0) + 1
    if plan.from_table:
        stages = ", ".join(f"stage {i} (seq_len {plan.stages[i].seq_len}) x{n}" for i, n in sorted(timed.items()))
    else:
        stages = f"one stage (seq_len {plan.stages[0].seq_len}) x{len(schedule_steps)}"
    return {"tokens": tokens, "flops": flops, "stages": stages}


def timed_steps(total: int, steps: int, at_step: int | None = None, adam_every: int = 1) -> list[int]:
    """The schedule positions bench times: `at_step` repeated, or `steps` spread over the run. With
    optim.adam_every = k, Adam steps only on steps whose index is k - 1 mod k, so the positions are
    moved to cycle through the k phases: spread positions are all multiples of total // steps, and
    (often all even) would otherwise time only the steps without Adam."""
    base = [at_step] * steps if at_step is not None else [(i * total) // steps for i in range(steps)]
    if adam_every == 1:
        return base
    return [min(total - 1, s - s % adam_every + i % adam_every) for i, s in enumerate(base)]


def time_steps(trainer, schedule_steps: list[int]) -> tuple[list[float], list[float], float]:
    """(seconds per step, exposed communication ms per step, host seconds in the loader in all) of
    one training step at each schedule position: CUDA events on a GPU, the wall clock elsewhere."""
    cuda = trainer.device.type == "cuda"
    # Host time spent handing out batches: the loader's whole cost to the step (copies are async).
    loader_s = [0.0]
    next_batch = trainer.loader.next_batch

    def timed_next_batch(*a, **k):
        t = time.perf_counter()
        out = next_batch(*a, **k)
        loader_s[0] += time.perf_counter() - t
        return out

    trainer.loader.next_batch = timed_next_batch
    step_times, comm_ms = [], []
    for s in schedule_steps:
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            trainer.train_step(s)
            end.record()
            end.synchronize()
            step_times.append(start.elapsed_time(end) / 1e3)
            wait = trainer.grad_sync.comm_wait_ms()
            if wait is not None:
                comm_ms.append(wait)
        else:
            t = time.perf_counter()
            trainer.train_step(s)
            step_times.append(time.perf_counter() - t)
    return step_times, comm_ms, loader_s[0]


def format_results(rows: list[tuple[str, dict]], measured_peak: float | None) -> str:
    keys = ["world_size", "tok_per_s", "step_ms_mean", "step_ms_median", "model_tflops_per_s", "mfu_datasheet", "mfu_measured",
            "peak_mem_alloc_gib", "peak_mem_reserved_gib", "memory_estimate_gib", "strategy", "loader_ms_per_step", "comm_wait_ms_per_step",
            "comm_exposed_frac", "compile_warmup_s", "setup_s", "attn_backend", "fp8_head"]
    lines = [f"{'':<22}" + "".join(f"{name:>18}" for name, _ in rows)]
    for key in keys:
        vals = []
        for _, r in rows:
            v = r.get(key)
            if key == "mfu_measured" and measured_peak:
                v = r["model_tflops_per_s"] * 1e12 / (measured_peak * r["world_size"])
            vals.append("-" if v is None else (f"{v:,.3f}" if isinstance(v, float) else str(v)))
        if any(v != "-" for v in vals):
            lines.append(f"{key:<22}" + "".join(f"{v:>18}" for v in vals))
    if len(rows) == 2:
        a, b = rows[0][1]["tok_per_s"], rows[1][1]["tok_per_s"]
        lines.append(f"{'B / A throughput':<22}{b / a:>18.3f}")
    for name, r in rows:  # MFU counts each timed step at its own stage's row length
        if "timed_stages" in r:
            lines.append(f"{name} timed steps: {r['timed_stages']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="speedgpt bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=None,
                   help="preset to measure (default: tiny-cpu without a GPU, speedrun-124m with one)")
    p.add_argument("--config", default=None, help="a config.toml to measure instead, e.g. a run's")
    p.add_argument("--steps", type=int, default=20, help="timed steps (after warmup)")
    p.add_argument("--at-step", type=int, default=None, help="time every step at this schedule position")
    p.add_argument("--ab", default=None, help='overrides for config B, e.g. "--model.fp8_head=false"')
    p.add_argument("--peak", action="store_true", help="also measure the device's bf16 matmul peak")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest ops of 2 profiled steps (of each config)")
    from .argv import bind_values

    args, overrides = p.parse_known_args(bind_values(list(argv if argv is not None else sys.argv[1:]), ("--ab",)))
    if args.steps < 1:
        p.error(f"--steps {args.steps}: must be >= 1")
    preset = args.preset
    if not preset and not args.config:
        preset = default_preset()
    cfg = resolve(preset, args.config, overrides)
    rows = [("A", bench_config(cfg, args.steps, args.at_step, args.profile))]
    if args.ab:
        print(f"A: {format_results(rows, None)}", flush=True)  # kept even if B fails or times out
        rows.append(("B", bench_config(apply_overrides(cfg, args.ab.split()), args.steps, args.at_step,
                                             args.profile)))
    from .parallel.dist import barrier, teardown

    rank = int(os.environ.get("RANK", "0"))
    barrier()  # no rank tears the group down while another still talks through it
    teardown()
    if rank:
        return 0
    measured = None
    if args.peak and torch.cuda.is_available():
        measured = measure_matmul_peak(torch.device("cuda"))
        print(f"measured bf16 matmul peak: {measured / 1e12:.0f} TFLOP/s")
    from .provenance import short_commit

    # The commit for docs/benchmarks.md's row: speedgpt's own (provenance.py), not the cwd's repository's.
    print(f"preset {preset or args.config}; overrides {' '.join(overrides) or '-'}"
          + (f"; B adds {args.ab}" if args.ab else "") + f"; commit {short_commit()}")
    print(format_results(rows, measured))
    return 0
