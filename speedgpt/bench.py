"""`speedgpt bench`: throughput, MFU, step time, peak memory and compile time of a config.

Runs the real training step (same data, same seed) after the warmup-then-reset, timed with CUDA
events over a window of steps, with no evaluation or checkpoints in between. `--ab` runs a second
config (the same plus other overrides) in the same process for an A/B comparison. On a GPU one more step after
the timed ones counts the host syncs of a step (host_syncs.py).
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

from .argv import Parser
from .config import Config, apply_overrides, default_preset, resolve
from .host_syncs import count_host_syncs
from .kernel_timeline import covered, kernel_category
from .train.compile_breakdown import PHASES
from .train.compile_watch import SLOWEST_KERNELS, describe_kernels

# compile_rows' rows after compile_compile_s, in the table's order
COMPILE_PHASE_ROWS = (*(f"compile_{name}_s" for name in PHASES), "compile_first_call_autotune_s",
                      "compile_fx_cache_hits", "compile_aot_cache_hits")


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


def print_kernel_categories(kernels, steps: int, step_ms: float | None = None) -> None:
    """Per-step GPU time by kernel category, from a trace's GPU kernels and copies (kernel_timeline.Kernel)."""
    from collections import Counter

    totals: Counter = Counter()
    for k in kernels:
        totals[kernel_category(k.name)] += (k.end - k.start) / 1e3 / steps
    print(f"GPU time per step by kernel category (ms, {steps} profiled steps):")
    for category, ms in totals.most_common():
        print(f"  {category:28s} {ms:9.1f}")
    print(f"  {'total':28s} {sum(totals.values()):9.1f}")
    # Kernels on several streams (NCCL beside compute) run at once: the sum over-counts the busy time, and
    # the GPU's idle time is the step minus the time some kernel runs (wave 6 printed a negative idle).
    busy = covered((k.start, k.end) for k in kernels) / 1e3 / steps
    print(f"  {'some kernel running':28s} {busy:9.1f}  (kernels at once: {sum(totals.values()) - busy:.1f})")
    if step_ms is not None:  # the same schedule steps timed without the profiler: the rest is GPU idle
        print(f"  {'step time, unprofiled':28s} {step_ms:9.1f}  (GPU idle ~{step_ms - busy:.1f})")


def bench_config(cfg: Config, steps: int, at_step: int | None = None, profile: int = 0,
                 per_stage: bool = False, trace: Path | None = None) -> dict:
    """Time `steps` training steps of `cfg` after its compile/warmup (`per_stage`: `steps` in each
    stage of its table); returns the figures. `trace`: where rank 0 writes the profiled steps' trace.
    The trainer's run directory is scratch, removed afterwards: bench's figures are what it prints and returns, and
    every bench left a speedgpt-bench-* folder in the temp dir (with on_nonfinite=rollback, a step-0 checkpoint)."""
    from .parallel.dist import barrier

    # every rank's (the Trainer takes rank 0's); a folder a rank cannot remove is left, not a failed bench
    with tempfile.TemporaryDirectory(prefix="speedgpt-bench-", ignore_cleanup_errors=True) as scratch:
        out = _bench_in(Path(scratch), cfg, steps, at_step, profile, per_stage, trace)
        barrier()  # no rank removes its folder while another may still write into rank 0's
    return out


def _bench_in(run_dir: Path, cfg: Config, steps: int, at_step: int | None, profile: int, per_stage: bool,
              trace: Path | None) -> dict:
    """bench_config's work, with `run_dir` for the trainer's files."""
    from .train.loop import Trainer

    # Each config compiles its own graph: dynamo would otherwise reuse the first config's compiled
    # model for a second one whose differences it does not guard on (an Inductor setting, say).
    torch._dynamo.reset()
    # log_every=1 arms the gradient-sync timers (multi-rank) on every step.
    cfg = apply_overrides(cfg, ["--run.report=false", "--run.sample_tokens=0", "--train.log_every=1"])
    trainer = Trainer(cfg, run_dir=run_dir, quiet=True)
    cfg = trainer.cfg  # with a budget's derived steps and batch
    t0 = time.perf_counter()
    trainer.setup()
    setup_s = time.perf_counter() - t0
    warm_s = trainer.warmup_then_reset()
    device = trainer.device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    stage_rows = None
    if per_stage:
        stage_rows, schedule_steps, step_times, comm_ms, loader_s = time_stages(trainer, steps)
    else:
        # Time steps spread over the schedule: the attention window (and so the cost) grows with progress.
        schedule_steps = timed_steps(cfg.train.steps, steps, at_step, cfg.optim.adam_every)
        step_times, comm_ms, loader_s = time_steps(trainer, schedule_steps)
    work = timed_work(trainer.plan, schedule_steps, trainer.progress.flops_per_token)
    if per_stage:  # the run's mean: every stage counted with its steps in the run
        mean = run_mean(stage_rows)
        mean_s, tokens_per_step, flops = mean["step_s"], mean["tokens_per_step"], mean["flops_per_token"]
    else:
        mean_s = statistics.mean(step_times)
        tokens_per_step = work["tokens"] / len(schedule_steps)
        flops = work["flops"] / work["tokens"]  # per token, averaged over the timed steps' tokens
    overlap = None
    if profile and cuda:
        overlap = profile_steps(trainer, schedule_steps[-2:], profile, statistics.mean(step_times[-2:]) * 1e3,
                                trace)
    if cuda:  # before the sync count's extra step: its peak is none of the timed steps'
        peak_alloc, peak_reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        sync_figures = host_sync_figures(trainer, schedule_steps[-1])
    trainer.checkpoints.finish()  # a step-0 checkpoint (on_nonfinite=rollback) still written in the background
    trainer.metrics.close()
    trainer.compile_watch.close()
    compiled = trainer.compile_watch.record() if trainer.compile_watch.enabled else None
    tok_s = tokens_per_step / mean_s
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
        # of it, torch.compile's own call: ~0 s, or the install of dynamo's saved package (train.compile_precompile)
        "compile_call_s": trainer.compile_call_s,
        **(compile_rows(compiled) if compiled else {}),
        "loader_ms_per_step": loader_s / len(step_times) * 1e3,
        "world_size": trainer.dist.world_size,
        "strategy": trainer.strategy,
        # what the gradients' reduce-scatter carries (parallel.grad_comm_dtype); one rank communicates nothing
        "grad_comm_dtype": trainer.cfg.parallel.grad_comm_dtype if trainer.dist.world_size > 1 else None,
        "memory_estimate_gib": trainer.memory_estimate.total / 2**30,  # to set against the measured peak
        "memory_estimate": trainer.memory_estimate.describe(),
        "attn_backend": trainer.model.runtime.attn_backend,
        "fp8_head": trainer.model.runtime.fp8_head,
    }
    if trainer.validation_ahead_note:  # the validation helper's outcome (train/validation_ahead.py), from the quiet log
        out["validation_ahead"] = trainer.validation_ahead_note
    if compiled and compiled["slowest_kernels"]:  # Triton's, so a GPU's: which kernels the cold start waited for
        out["compile_slowest_kernels"] = describe_kernels(compiled["slowest_kernels"][:5])
    if stage_rows is not None:
        out["per_stage"] = stage_rows
        out["run_train_s"] = mean["train_s"]
    if overlap is not None:
        out["comm_overlap"] = overlap
    if comm_ms:
        out["comm_wait_ms_per_step"] = statistics.mean(comm_ms)
        out["comm_exposed_frac"] = statistics.mean(comm_ms) / 1e3 / mean_s
    if trainer.dist.world_size > 1:
        # The rank that waits least is the one the others wait for (wave 8: 7.6 / 6.8 / 2.8 / 7.7 ms).
        out["comm_wait_ms_by_rank"] = by_rank(statistics.mean(comm_ms) if comm_ms else float("nan"))
    if trainer.peak:
        out["mfu_datasheet"] = tok_s * flops / (trainer.peak * trainer.dist.world_size)
        for row in stage_rows or ():
            row["mfu_datasheet"] = row["tok_per_s"] * row["flops_per_token"] / (trainer.peak * trainer.dist.world_size)
    if cuda:
        out["peak_mem_alloc_gib"] = peak_alloc / 2**30
        out["peak_mem_reserved_gib"] = peak_reserved / 2**30
        out.update(sync_figures)
    del trainer
    if cuda:
        torch.cuda.empty_cache()
    return out


def host_sync_figures(trainer, step: int, count=count_host_syncs) -> dict:
    """{"host_syncs_per_step", and where there are any "host_sync_sites"} of one more training step at
    schedule position `step` (a timed one: no new shapes, no recompile), run after every timed or profiled
    step with torch's sync debug mode on (host_syncs.py), then waited for: its work runs into nothing bench
    measures. It trains the model one step further; the next config (--ab) builds its own trainer."""
    syncs = count(lambda: trainer.train_step(step))
    trainer.sync_device()
    trainer.grad_sync.take_timers()  # its communication waits are no timed step's (bench times every step's)
    out = {"host_syncs_per_step": syncs.count}
    if syncs.count:
        out["host_sync_sites"] = syncs.describe()
    return out


def compile_rows(record: dict) -> dict:
    """What the warmup compiled (train/compile_watch.py): graphs, recompiles, seconds inside the compilers and
    in each of their phases (train/compile_breakdown.py; None, "-" in the table, where torch does not expose
    one), Triton's autotuning at the kernels' first launch, and the caches' hits of their lookups."""
    rows = {f"compile_{k}": record[k] for k in ("graphs", "recompiles", "compile_s")}
    rows.update({f"compile_{name}_s": record[f"{name}_s"] for name in PHASES})
    rows["compile_first_call_autotune_s"] = record["first_call_autotune_s"]
    for cache in ("fx", "aot"):
        hits, misses = record[f"{cache}_cache_hits"], record[f"{cache}_cache_misses"]
        rows[f"compile_{cache}_cache_hits"] = None if hits is None or misses is None else f"{hits}/{hits + misses}"
    return rows


def profile_steps(trainer, positions: list[int], rows: int, step_ms: float, trace: Path | None = None) -> dict | None:
    """Profile the training steps at `positions` and print (on rank 0) the `rows` costliest ops, GPU
    time by kernel category and the communication against compute per step; returns the mean of
    the latter (kernel_timeline.py; None on other ranks). The figures are read from the profile's
    Chrome trace (the one source, benchmarks/trace_report.py reads a saved one the same way):
    `trace` keeps it (gzipped; chrome://tracing, Perfetto), else it goes to a temporary file; with
    `trace` every other rank keeps its own too (rank_trace), to find the rank the others wait for."""
    from torch.profiler import ProfilerActivity, profile as torch_profile, record_function

    from .kernel_timeline import STEP_RANGE, load_trace, profiled_steps
    from .step_timeline import trace_report

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in positions:
            with record_function(STEP_RANGE):  # waits for the GPU inside: a step's kernels start in its range
                trainer.train_step(s)
                trainer.sync_device()
    if not trainer.dist.is_main:
        if trace is not None:
            prof.export_chrome_trace(str(rank_trace(trace, trainer.dist.rank)))
        return None
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows))
    with tempfile.TemporaryDirectory(prefix="speedgpt-trace-") as tmp:
        path = trace if trace is not None else Path(tmp) / "profile.json"
        prof.export_chrome_trace(str(path))  # a name ending in .gz is written gzipped
        events = load_trace(path)
    if trace is not None:
        print(f"profile trace: {trace}", flush=True)
    steps, outside, unlinked = profiled_steps(events)
    print_kernel_categories([k for s in steps for k in s], steps=len(positions), step_ms=step_ms)
    lines, mean = trace_report(steps, outside, unlinked)
    print("\n".join(lines), flush=True)
    return mean


def by_rank(value: float) -> str | None:
    """Every rank's `value` in rank order, "v0/v1/..." (a collective: every rank calls it); None where no
    rank has one (nan: fsdp times no waits)."""
    import math

    import torch.distributed as dist

    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return None if all(math.isnan(v) for v in values) else "/".join(f"{v:.1f}" for v in values)


def rank_trace(trace: Path, rank: int) -> Path:
    """Where rank `rank` writes the trace bench names `trace`: rank 0 there, rank r beside it
    (profile-A.json.gz, profile-A-rank1.json.gz, ...)."""
    return trace if rank == 0 else trace.with_name(trace.name.replace(".json", f"-rank{rank}.json", 1))


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


def timed_steps(total: int, steps: int, at_step: int | None = None, adam_every: int = 1, first: int = 0) -> list[int]:
    """The schedule positions bench times: `at_step` repeated, or `steps` spread over steps
    [first, total). With optim.adam_every = k, Adam steps only on steps whose index is k - 1 mod k,
    so the positions are moved to cycle through the k phases: spread positions are all multiples of
    total // steps, and (often all even) would otherwise time only the steps without Adam."""
    span = total - first
    base = [at_step] * steps if at_step is not None else [first + (i * span) // steps for i in range(steps)]
    if adam_every == 1:
        return base
    moved = []
    for i, s in enumerate(base):
        p = s - s % adam_every + i % adam_every
        moved.append(min(total - 1, p + adam_every if p < first else p))  # never before `first`
    return moved


def time_steps(trainer, schedule_steps: list[int]) -> tuple[list[float], list[float], float]:
    """(seconds per step, exposed communication ms per step, host seconds in the loader in all) of
    one training step at each schedule position: CUDA events on a GPU, the wall clock elsewhere.

    On a GPU the steps run back to back as in training: the host queues the next step while the GPU
    runs this one (no sync between steps; a sync per step added the host's own start of every step,
    loader included, to its time: 4 GPUs' shorter steps lost more of it). Step i's time runs from
    the mark after step i-1 to the mark after it, so a GPU waiting for the host still counts. All
    ranks start the window together (a barrier): a rank that left its compile first would otherwise
    time its wait for the others."""
    from .parallel.ddp import wait_ms
    from .parallel.dist import barrier

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
    step_times, waits = [], []  # waits: each step's communication waits, read after the window (reading syncs)
    try:
        if cuda:
            barrier()
            torch.cuda.synchronize(trainer.device)
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(schedule_steps) + 1)]
            marks[0].record()
            for i, s in enumerate(schedule_steps):
                trainer.train_step(s)
                marks[i + 1].record()
                waits.append(trainer.grad_sync.take_timers())
            marks[-1].synchronize()
            step_times = [a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])]
        else:
            for s in schedule_steps:
                t = time.perf_counter()
                trainer.train_step(s)
                step_times.append(time.perf_counter() - t)
                waits.append(trainer.grad_sync.take_timers())
    finally:
        trainer.loader.next_batch = next_batch  # unwrapped: a later call wraps it afresh
    return step_times, [ms for ms in map(wait_ms, waits) if ms is not None], loader_s[0]


def dynamo_compiles() -> int:
    """Frames torch.compile has compiled (or tried to) in this process so far. Dynamo is asked only
    when no compiled graph's guards match, so after the warmup any increase is a recompile."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def time_stages(trainer, steps: int):
    """Time `steps` steps spread over each stage of the run (its table's, or the one stage of a run
    without a table). Each stage first trains one untimed step at its start: entering a stage sets
    up new shapes (loader rows, micro-steps), a once-per-stage cost that is not a step's. Returns
    (one row of figures per stage, the timed positions, their seconds, exposed communication ms per
    step, loader host seconds)."""
    cfg, world = trainer.cfg, trainer.dist.world_size
    rows, positions, times, comm, loader_s = [], [], [], [], 0.0
    for stage in trainer.plan.stages:
        before = dynamo_compiles()
        trainer.train_step(stage.start)
        pos = timed_steps(stage.end, steps, adam_every=cfg.optim.adam_every, first=stage.start)
        stage_times, stage_comm, stage_loader_s = time_steps(trainer, pos)
        micro_rows, accum = trainer.plan.stage_batch(stage)
        step_s = statistics.mean(stage_times)
        rows.append({"stage": stage.index, "first_step": stage.start, "last_step": stage.end - 1,
                     "run_steps": stage.steps, "batch_tokens": stage.batch_tokens,
                     "rows": stage.batch_tokens // stage.seq_len, "seq_len": stage.seq_len,
                     "ranks_micro_rows": f"{world} x {accum} x {micro_rows}", "timed_steps": len(pos),
                     "step_ms": step_s * 1e3, "tok_per_s": stage.batch_tokens / step_s,
                     "flops_per_token": trainer.progress.flops_per_token(stage.seq_len),
                     "recompiles": dynamo_compiles() - before})
        positions += pos
        times += stage_times
        comm += stage_comm
        loader_s += stage_loader_s
    return rows, positions, times, comm, loader_s


def run_mean(stage_rows: list[dict]) -> dict:
    """The whole run's figures from per-stage ones, each stage weighted by its number of steps in
    the run: total tokens over total time, so a stage table compares with a one-stage run's single
    figure. {"tok_per_s", "step_s", "train_s" (the run's steps at these speeds), "tokens_per_step",
    "flops_per_token"}."""
    steps = sum(r["run_steps"] for r in stage_rows)
    train_s = sum(r["run_steps"] * r["step_ms"] / 1e3 for r in stage_rows)
    tokens = sum(r["run_steps"] * r["batch_tokens"] for r in stage_rows)
    flops = sum(r["run_steps"] * r["batch_tokens"] * r["flops_per_token"] for r in stage_rows)
    return {"tok_per_s": tokens / train_s, "step_s": train_s / steps, "train_s": train_s,
            "tokens_per_step": tokens / steps, "flops_per_token": flops / tokens}


def format_stages(name: str, r: dict) -> list[str]:
    """The per-stage table of one config's figures (bench --per-stage)."""
    rows = r["per_stage"]
    lines = [f"{name} per stage ({rows[0]['timed_steps']} timed steps in each, after one untimed step at its start):",
             f"  {'stage':>5} {'steps':>11} {'batch':>9} {'rows x seq_len':>15} {'ranks x micro x rows':>21} "
             f"{'ms/step':>9} {'tok/s':>11} {'MFU':>6} {'recompiles':>10}"]
    for s in rows:
        mfu = f"{s['mfu_datasheet']:.1%}" if "mfu_datasheet" in s else "-"
        steps = f"{s['first_step']}-{s['last_step']}"
        lines.append(f"  {s['stage']:>5} {steps:>11} {s['batch_tokens']:>9,} "
                     f"{s['rows']:>6} x {s['seq_len']:<6} {s['ranks_micro_rows']:>21} {s['step_ms']:>9.1f} "
                     f"{s['tok_per_s']:>11,.0f} {mfu:>6} {s['recompiles']:>10}")
    mfu = f", MFU {r['mfu_datasheet']:.1%}" if "mfu_datasheet" in r else ""
    steps = sum(s["run_steps"] for s in rows)
    lines.append(f"  run mean (stages weighted by their steps): {r['tok_per_s']:,.0f} tok/s, "
                 f"{r['step_ms_mean']:.1f} ms/step{mfu}; {r['run_train_s']:.1f} s for the run's {steps} steps")
    for s in rows:
        if s["recompiles"]:
            lines.append(f"  stage {s['stage']}: {s['recompiles']} recompile(s) after the warmup (a finding: "
                         f"the warmup did not compile every graph this stage runs)")
    return lines


KEY_WIDTH = 30  # the table's first column: its longest key, compile_first_call_autotune_s


def format_results(rows: list[tuple[str, dict]], measured_peak: float | None) -> str:
    keys = ["world_size", "tok_per_s", "step_ms_mean", "step_ms_median", "model_tflops_per_s", "mfu_datasheet",
            "mfu_measured", "peak_mem_alloc_gib", "peak_mem_reserved_gib", "memory_estimate_gib", "run_train_s",
            "strategy", "grad_comm_dtype", "loader_ms_per_step", "host_syncs_per_step", "comm_wait_ms_per_step",
            "comm_wait_ms_by_rank", "comm_exposed_frac", "compile_warmup_s", "compile_call_s", "compile_graphs",
            "compile_recompiles", "compile_compile_s", *COMPILE_PHASE_ROWS,
            "setup_s", "attn_backend", "fp8_head"]
    lines = [f"{'':<{KEY_WIDTH}}" + "".join(f"{name:>18}" for name, _ in rows)]
    for key in keys:
        vals = []
        for _, r in rows:
            v = r.get(key)
            if key == "mfu_measured" and measured_peak:
                v = r["model_tflops_per_s"] * 1e12 / (measured_peak * r["world_size"])
            vals.append("-" if v is None else (f"{v:,.3f}" if isinstance(v, float) else str(v)))
        if any(v != "-" for v in vals):
            lines.append(f"{key:<{KEY_WIDTH}}" + "".join(f" {v:>17}" for v in vals))  # a space even past 17
    if len(rows) == 2:
        a, b = rows[0][1]["tok_per_s"], rows[1][1]["tok_per_s"]
        lines.append(f"{'B / A throughput':<{KEY_WIDTH}}{b / a:>18.3f}")
    for name, r in rows:  # MFU counts each timed step at its own stage's row length
        if "timed_stages" in r:
            lines.append(f"{name} timed steps: {r['timed_stages']}")
        if "host_sync_sites" in r:  # the lines to read first when host_syncs_per_step is not 0
            lines.append(f"{name} host syncs at: {r['host_sync_sites']}")
        if "compile_slowest_kernels" in r:  # where the compile table's kernels seconds went
            lines.append(f"{name} {SLOWEST_KERNELS}: {r['compile_slowest_kernels']}")
        if "validation_ahead" in r:  # how long the warmup waited for the validation helper
            lines.append(f"{name} {r['validation_ahead']}")
        if "memory_estimate" in r:  # beside the measured peak above
            lines.append(f"{name} memory estimate: {r['memory_estimate']}")
        if "per_stage" in r:
            lines += format_stages(name, r)
    return "\n".join(lines)


def profile_traces(p: argparse.ArgumentParser, folder: str | None, profile: int) -> dict:
    """{"A": path, "B": path} of the profile traces under `folder` (None each without it); refuses
    --profile-trace without --profile, a folder that is a file, and traces already there (never
    overwritten: another bench's profile)."""
    if folder is None:
        return {"A": None, "B": None}
    if not profile:
        p.error("--profile-trace writes the profiled steps: add --profile N")
    root = Path(folder)
    if root.exists() and not root.is_dir():
        p.error(f"--profile-trace {folder}: a file, not a folder; give a folder")
    paths = {label: root / f"profile-{label}.json.gz" for label in ("A", "B")}
    taken = [str(q) for q in paths.values() if q.exists()] + sorted(str(q) for q in root.glob("profile-*-rank*"))
    if taken:
        p.error(f"--profile-trace {folder}: {taken[0]} exists; give a new folder")
    root.mkdir(parents=True, exist_ok=True)
    return paths


def cuda_present() -> bool:
    """Whether --profile and --peak have kernels to measure (tests of their paths stand in a GPU here)."""
    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="speedgpt bench", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=None,
                   help="preset to measure (default: tiny-cpu without a GPU, speedrun-latest with one)")
    p.add_argument("--config", default=None, help="a config.toml to measure instead, e.g. a run's")
    p.add_argument("--steps", type=int, default=20, help="timed steps (after warmup)")
    p.add_argument("--at-step", type=int, default=None, help="time every step at this schedule position")
    p.add_argument("--ab", default=None, help='overrides for config B, e.g. "--model.fp8_head=false"')
    p.add_argument("--peak", action="store_true", help="also measure the device's bf16 matmul peak")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print the N costliest ops of 2 profiled steps (of each config), GPU time by kernel category, "
                        "and the communication kernels' overlap with compute")
    p.add_argument("--profile-trace", default=None, metavar="DIR",
                   help="with --profile: rank 0 writes each config's profiled steps to DIR/profile-A.json.gz "
                        "(and -B) as a Chrome trace (Perfetto, chrome://tracing), rank r to "
                        "DIR/profile-A-rank<r>.json.gz; benchmarks/trace_report.py reads them")
    p.add_argument("--per-stage", action="store_true",
                   help="time --steps steps inside each stage of the config's stage table (train.stages) and print "
                        "each stage's figures and the run's mean (stages weighted by their steps)")
    from .argv import bind_values

    args, overrides = p.parse_known_args(bind_values(list(argv if argv is not None else sys.argv[1:]), ("--ab",)))
    if args.steps < 1:
        p.error(f"--steps {args.steps}: must be >= 1")
    if args.profile < 0:
        p.error(f"--profile {args.profile}: must be >= 0 (0: no profile)")
    if args.at_step is not None and args.at_step < 0:
        p.error(f"--at-step {args.at_step}: must be a step of the run (>= 0)")
    if args.per_stage and args.at_step is not None:
        p.error("--per-stage times steps inside every stage; drop --at-step")
    if args.ab is not None and not args.ab.strip():  # an empty shell variable, say: only A would be timed
        p.error("--ab is empty: give config B's overrides, e.g. --ab=--model.fp8_head=false, or drop --ab")
    gpu_only = [f for f, on in (("--profile", args.profile), ("--peak", args.peak)) if on]
    if gpu_only and not cuda_present():  # each measured nothing on a CPU, exit 0
        p.error(f"{' and '.join(gpu_only)} measure{'s' if len(gpu_only) == 1 else ''} CUDA kernels: run on a GPU, "
                f"or drop {'it' if len(gpu_only) == 1 else 'them'}")
    traces = profile_traces(p, args.profile_trace, args.profile)
    preset = args.preset
    if not preset and not args.config:
        preset = default_preset()
    cfg = resolve(preset, args.config, overrides)
    # Both configs planned as the trainer plans them (budget, rows fitted to the ranks) before A is timed: a bad --ab
    # (or --at-step) found after A's compile cost that compile.
    from .planner import plan_run

    cfg_b = apply_overrides(cfg, args.ab.split()) if args.ab else None
    if cfg_b == cfg:  # values A already has: the table put two timings of one config side by side as an A/B
        source = f"--preset {preset}" if preset else f"--config {args.config}"
        p.error(f"--ab {args.ab!r} changes nothing: A already has those values, so B would time the same config "
                f"(`speedgpt config {' '.join([source, *overrides])}` lists A's); give B a value A lacks, or drop --ab")
    for c in (cfg, cfg_b):
        if c is not None:
            steps = plan_run(c, int(os.environ.get("WORLD_SIZE", "1"))).cfg.train.steps
            if args.at_step is not None and not 0 <= args.at_step < steps:
                p.error(f"--at-step {args.at_step}: must be a step of the run, 0 to {steps - 1}")
    rank = int(os.environ.get("RANK", "0"))
    rows = [("A", bench_config(cfg, args.steps, args.at_step, args.profile, args.per_stage, traces["A"]))]
    if cfg_b is not None:
        if not rank:  # kept even if B fails or times out; every rank's wait is in comm_wait_ms_by_rank
            print(f"A: {format_results(rows, None)}", flush=True)
        rows.append(("B", bench_config(cfg_b, args.steps, args.at_step, args.profile, args.per_stage, traces["B"])))
    from .parallel.dist import barrier, teardown

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
