"""Where one profiled training step's GPU time goes, from its kernels (kernel_timeline.trace_kernels):
the compute stream's phases in order (forward and backward compiled graphs per micro-step, the
optimizers), its gaps split into time some NCCL kernel runs (the stream waits on a collective) and
time nothing runs (idle: the host is late, or a collective's wait on other ranks has not begun), and
each collective placed against the backward's last kernel.

An NCCL kernel's duration on one rank is its transfer plus its wait for the other ranks to join it:
a trace of one rank cannot tell them apart, so `describe_step` prints each collective's bytes beside
its time (a 288-byte all-gather that takes 2 ms is waiting). The launch lag (a kernel's start minus
its launch call's) says whether the GPU ran ahead of the host: near zero, the host was late.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .kernel_timeline import Kernel, describe_overlap, mean_overlap, merged, overlap, step_overlap


@dataclass(frozen=True)
class Segment:
    """A run of consecutive compute kernels launched in one phase."""

    phase: str
    start: float  # µs
    end: float
    busy: float  # µs some kernel of it runs
    nccl_wait: float  # µs of its gaps during which an NCCL kernel runs
    idle: float  # µs of its gaps with no kernel at all
    lag: float | None  # median launch lag of its kernels, µs
    kernels: int


def segments(kernels: list[Kernel]) -> list[Segment]:
    """The compute kernels (not NCCL, not copies) in start order, cut where the phase changes; a
    gap before a kernel counts in the kernel's segment."""
    compute = sorted((k for k in kernels if not k.is_comm and not k.is_copy), key=lambda k: k.start)
    nccl = merged((k.start, k.end) for k in kernels if k.is_comm)
    runs: list[list[Kernel]] = []
    for k in compute:
        if runs and runs[-1][0].phase == k.phase:
            runs[-1].append(k)
        else:
            runs.append([k])
    out, prev_end = [], None
    for run in runs:
        start = run[0].start if prev_end is None else prev_end
        end = max(k.end for k in run)
        spans = merged((k.start, k.end) for k in run)
        gaps, edge = [], start
        for a, b in spans:
            if a > edge:
                gaps.append((edge, a))
            edge = max(edge, b)
        wait = overlap(gaps, nccl)
        gap = sum(b - a for a, b in gaps)
        lags = [k.start - k.launched for k in run if k.launched is not None]
        out.append(Segment(run[0].phase or "other", start, end, sum(b - a for a, b in spans), wait, gap - wait,
                           statistics.median(lags) if lags else None, len(run)))
        prev_end = max(end, prev_end or end)
    return out


def backward_end(kernels: list[Kernel], graphs_only: bool = False) -> float | None:
    """The end of the backward's last compute kernel (its compiled graphs' and its hooks': gradient
    accumulation and the buckets' packing; `graphs_only`: the compiled graphs')."""
    ends = [k.end for k in kernels if k.backward and not k.is_comm and not k.is_copy and (k.graph or not graphs_only)]
    return max(ends) if ends else None


def collectives(kernels: list[Kernel]) -> dict[str, list[Kernel]]:
    """The NCCL kernels of the step by collective, in start order."""
    out: dict[str, list[Kernel]] = {}
    for k in sorted((k for k in kernels if k.is_comm), key=lambda k: k.start):
        out.setdefault(k.collective or k.name.split("(")[0], []).append(k)
    return out


def step_summary(kernels: list[Kernel]) -> dict:
    """The step's figures in ms: "span" (first kernel's start to last kernel's end), "busy", "nccl_wait",
    "idle" (the compute stream's, from its first kernel to the step's last), the same per phase
    ("phases": {phase: {"busy", "nccl_wait", "idle"}}), and "nccl_after" (NCCL kernels running after the
    compute stream's last kernel, which the step still waits for)."""
    segs = segments(kernels)
    first, last = min(k.start for k in kernels), max(k.end for k in kernels)
    phases: dict[str, dict] = {}
    for s in segs:
        p = phases.setdefault(s.phase, {"busy": 0.0, "nccl_wait": 0.0, "idle": 0.0})
        p["busy"] += s.busy / 1e3
        p["nccl_wait"] += s.nccl_wait / 1e3
        p["idle"] += s.idle / 1e3
    compute_end = max((s.end for s in segs), default=first)
    tail = [(compute_end, last)] if last > compute_end else []
    nccl = [(k.start, k.end) for k in kernels if k.is_comm]
    lead = segs[0].start - first if segs else 0.0  # before the first compute kernel: copies, the loader's
    return {"span": (last - first) / 1e3, "busy": sum(s.busy for s in segs) / 1e3,
            "nccl_wait": sum(s.nccl_wait for s in segs) / 1e3 + overlap(tail, nccl) / 1e3,
            "idle": sum(s.idle for s in segs) / 1e3 + (sum(b - a for a, b in tail) - overlap(tail, nccl)
                                                         + lead) / 1e3,
            "phases": phases, "nccl_after": overlap(tail, nccl) / 1e3}


def describe_step(kernels: list[Kernel], label: str, each: bool = False) -> list[str]:
    """The printout of one step: its phases on the compute stream, then its collectives against the
    backward's end (times in ms from the step's first kernel); `each`: every collective kernel too."""
    if not kernels:
        return [f"{label}: no kernel"]
    t0 = min(k.start for k in kernels)
    summary = step_summary(kernels)
    lines = [f"{label}: {summary['span']:.2f} ms from its first kernel to its last; compute stream busy "
             f"{summary['busy']:.2f}, waiting while NCCL runs {summary['nccl_wait']:.2f}, idle {summary['idle']:.2f}",
             f"  {'phase':22s} {'start':>8s} {'end':>8s} {'busy':>7s} {'NCCL':>6s} {'idle':>6s} {'lag':>6s} kernels"]
    for s in segments(kernels):
        lag = "-" if s.lag is None else f"{s.lag / 1e3:.2f}"
        lines.append(f"  {s.phase:22s} {(s.start - t0) / 1e3:8.2f} {(s.end - t0) / 1e3:8.2f} {s.busy / 1e3:7.2f} "
                     f"{s.nccl_wait / 1e3:6.2f} {s.idle / 1e3:6.2f} {lag:>6s} {s.kernels}")
    end = backward_end(kernels)
    graph_end = backward_end(kernels, graphs_only=True)
    if end is not None:
        graphs = "" if graph_end is None else f" (its compiled graphs' at {(graph_end - t0) / 1e3:.2f})"
        lines.append(f"  backward's last kernel ends at {(end - t0) / 1e3:.2f}{graphs}; collectives against it (ms):")
    ref = end if end is not None else t0
    for name, ks in collectives(kernels).items():
        time = sum(k.end - k.start for k in ks) / 1e3
        mib = sum(k.nbytes for k in ks) / 2**20
        lines.append(f"  {name:22s} x{len(ks):<3d} first starts {(ks[0].start - ref) / 1e3:+7.2f}, last ends "
                     f"{(max(k.end for k in ks) - ref) / 1e3:+7.2f}; kernels {time:6.2f} ms for {mib:7.1f} MiB")
        for k in ks if each else ():
            lines.append(f"    {(k.start - ref) / 1e3:+8.2f} {(k.end - ref) / 1e3:+8.2f}  "
                         f"{(k.end - k.start) / 1e3:6.3f} ms {k.nbytes / 2**20:8.2f} MiB  {k.phase or 'other'}")
    return lines


def trace_report(steps: list[list[Kernel]], outside: int, unlinked: int, each: bool = False) -> tuple[list[str], dict]:
    """(the printout of a profile's steps: communication against compute, then each step's timeline;
    the mean of the former over the steps)."""
    per_step = [step_overlap(kernels) for kernels in steps]
    lines = describe_overlap(per_step, outside, unlinked)
    for i, kernels in enumerate(steps):
        lines += describe_step(kernels, f"step {i + 1}", each)
    return lines, mean_overlap(per_step)


def compare_traces(traces: list[tuple[str, list[list[Kernel]]]]) -> list[str]:
    """One line per trace and profiled step: its figures (step_summary) and, on the clock the traces
    share (the ranks of one host), when its compiled backward ends and its step's last kernel ends,
    from the earliest first kernel among them: the rank whose backward ends last is the one the
    others wait for."""
    lines = [f"{'trace':28s} {'step':>4s} {'span':>7s} {'busy':>7s} {'NCCL':>6s} {'idle':>6s} "
             f"{'bwd graph end':>13s} {'last end':>9s}  (ms; the two ends from the earliest start)"]
    for i in range(max(len(steps) for _, steps in traces)):
        present = [(name, steps[i]) for name, steps in traces if i < len(steps) and steps[i]]
        if not present:
            continue
        t0 = min(min(k.start for k in ks) for _, ks in present)
        for name, ks in present:
            s = step_summary(ks)
            end = backward_end(ks, graphs_only=True)
            end_text = "-" if end is None else f"{(end - t0) / 1e3:.2f}"
            lines.append(f"{name[-28:]:28s} {i + 1:4d} {s['span']:7.2f} {s['busy']:7.2f} {s['nccl_wait']:6.2f} "
                         f"{s['idle']:6.2f} {end_text:>13s} {(max(k.end for k in ks) - t0) / 1e3:9.2f}")
    return lines
