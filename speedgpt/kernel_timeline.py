"""GPU kernels on a timeline, from a torch.profiler Chrome trace: how much of the communication
(NCCL kernels) runs under compute kernels, per training step, and whether it starts inside the backward.

`speedgpt bench --profile N` prints these figures (docs/distributed.md) from the trace it exports, and
`benchmarks/trace_report.py` from a saved one: the trace is the one source, so a GPU lease's profile
reads the same on a machine without a GPU. The arithmetic is on plain (start, end) spans.

Which kernel belongs to the backward: each GPU event in the trace carries the "External id" of the
op that launched it, and the autograd engine runs every backward node inside a range named
"autograd::engine::evaluate_function: ...", so a kernel is the backward's when that range encloses
its launching op on the op's thread (on a GPU the engine's own thread, not the main one). Inductor
wraps each Triton launch in an op named after its kernel, inside the graph's call, so compiled
graphs' kernels link like any other. Which step a kernel belongs to: bench wraps each profiled step
in a range named STEP_RANGE and waits for the GPU before closing it, so a step's kernels start inside
its range (the trace puts CPU and GPU events on one clock).
"""

from __future__ import annotations

from dataclasses import dataclass

Span = tuple[float, float]  # (start, end), in microseconds as the profiler gives them

STEP_RANGE = "speedgpt.bench.step"
BACKWARD_RANGE = "autograd::engine::evaluate_function"
GRAPH_CALL = "## Call CompiledFxGraph"  # Inductor's range around each call of a compiled graph

# GPU kernels by what they do, matched on kernel names (first match wins); the rest is "other".
KERNEL_CATEGORIES = (
    ("nccl", ("nccl",)),  # first: communication must never be counted as compute
    ("flex attention", ("flex", "attention")),
    ("cross-entropy (ours)", ("softcap_ce",)),
    ("relu² + fp8 casts (ours)", ("relu2_fp8",)),
    # cuBLAS names its FP8 kernels nvjet_sm90_qq* / qr* (bf16: nvjet_sm90_tst*)
    ("fp8 matmul", ("f8", "fp8", "e4m3", "e5m2", "sm90_qq", "sm90_qr", "sm90_rq")),
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "sm90_", "wgmma")),
    ("triton templates (flex)", ("triton_tem",)),
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


@dataclass(frozen=True)
class Kernel:
    name: str
    start: float  # µs
    end: float
    backward: bool  # launched by an op of the autograd backward
    stream: int = 0
    phase: str = ""  # the outermost labelled range its op ran in: "forward", "backward", "optimizer DistMuon"
    collective: str = ""  # an NCCL kernel's collective ("_reduce_scatter_base"), as the trace names it
    launched: float | None = None  # when the host's launch call (cudaLaunchKernel, ...) started, µs
    nbytes: int = 0  # an NCCL kernel's input in bytes
    graph: bool = False  # launched inside a compiled graph's call

    @property
    def is_comm(self) -> bool:
        return kernel_category(self.name) == "nccl"

    @property
    def is_copy(self) -> bool:  # memcpy/memset: neither communication nor compute
        return kernel_category(self.name) == "memcpy/memset"


def merged(spans) -> list[Span]:
    """The union of `spans` as sorted, disjoint spans (touching ones joined)."""
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def covered(spans) -> float:
    """Time covered by at least one of `spans`."""
    return sum(b - a for a, b in merged(spans))


def overlap(spans_a, spans_b) -> float:
    """Time covered by both a span of `spans_a` and a span of `spans_b`."""
    a, b = merged(spans_a), merged(spans_b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def step_overlap(kernels: list[Kernel]) -> dict:
    """One step's communication against its compute, in ms: "comm_ms" (time some NCCL kernel runs),
    "overlapped_ms" (of it, time some compute kernel runs too), "exposed_ms" (the rest), and
    "comm_lead_ms": the end of the last backward compute kernel minus the start of the first NCCL
    kernel the backward launched (the gradient reduction; the first NCCL kernel of the step if the
    backward launched none), > 0 when the reduction starts that long before the backward ends.
    None without NCCL kernels or without a compute kernel known to be the backward's. Only the
    backward's NCCL kernels count for the start: under fsdp the forward's all-gathers come first."""
    comm = [(k.start, k.end) for k in kernels if k.is_comm]
    compute = [k for k in kernels if not k.is_comm and not k.is_copy]
    comm_us = covered(comm)
    overlapped_us = overlap(comm, [(k.start, k.end) for k in compute])
    backward_ends = [k.end for k in compute if k.backward]
    reduction_starts = [k.start for k in kernels if k.is_comm and k.backward] or [start for start, _ in comm]
    lead = None
    if reduction_starts and backward_ends:
        lead = (max(backward_ends) - min(reduction_starts)) / 1e3
    return {"comm_ms": comm_us / 1e3, "overlapped_ms": overlapped_us / 1e3,
            "exposed_ms": (comm_us - overlapped_us) / 1e3, "comm_lead_ms": lead}


def split_by_step(kernels: list[Kernel], windows: list[Span]) -> tuple[list[list[Kernel]], int]:
    """The kernels of each window (by their start), and how many started in none."""
    steps: list[list[Kernel]] = [[] for _ in windows]
    outside = 0
    for k in kernels:
        for i, (lo, hi) in enumerate(windows):
            if lo <= k.start < hi:
                steps[i].append(k)
                break
        else:
            outside += 1
    return steps, outside


def mean_overlap(per_step: list[dict]) -> dict:
    """The mean of each figure over the steps (None where no step has it)."""
    out = {}
    for key in ("comm_ms", "overlapped_ms", "exposed_ms", "comm_lead_ms"):
        vals = [s[key] for s in per_step if s[key] is not None]
        out[key] = sum(vals) / len(vals) if vals else None
    return out


# -- reading a profile ---------------------------------------------------------------------------

CPU_RANGES = ("cpu_op", "user_annotation")  # the trace's categories of ops and record_function ranges
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # of GPU work; not gpu_user_annotation (a range's span)
DTYPE_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Double": 8, "Int": 4,
               "Long": 8, "Byte": 1, "Char": 1}  # an NCCL kernel's "dtype" as the trace names it


def load_trace(path) -> list[dict]:
    """The events of a Chrome trace as torch.profiler writes it (`export_chrome_trace`; gzipped when the
    name ends in .gz). ValueError, one line, for a file that is not one."""
    import gzip
    import json
    from pathlib import Path

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable Chrome trace ({type(e).__name__}: {e})") from None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        raise ValueError(f"{path}: no traceEvents list; give a trace written by torch.profiler (bench --profile-trace)")
    return events


@dataclass(frozen=True)
class Op:
    """A CPU op or record_function range of the trace, and what encloses it on its thread."""

    name: str
    start: float
    end: float
    backward: bool  # inside the autograd engine's range
    phase: str  # the outermost labelled range around it (_label), "" in none
    graph: bool  # inside a compiled graph's call


def _label(name: str) -> str:
    """The phase a range names: the backward, an optimizer's step, a compiled (forward) graph's call."""
    if name.startswith(BACKWARD_RANGE):
        return "backward"
    if name.startswith("Optimizer.step#"):  # torch.optim's range: Optimizer.step#DistMuon.step
        return "optimizer " + name.split("#", 1)[1].removesuffix(".step")
    if name.startswith(GRAPH_CALL):
        return "forward"
    return ""


def trace_ops(events: list[dict]) -> dict[int, Op]:
    """The trace's CPU ops and ranges by their "External id" (the id their GPU work carries), each
    with what encloses it: ranges nest by time on one thread. The autograd engine runs the backward
    on its own thread (pt_autograd_0 on a GPU): its ops nest under the engine's range there."""
    by_thread: dict[tuple, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in CPU_RANGES:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    ops: dict[int, Op] = {}
    for thread_events in by_thread.values():
        stack: list[Op] = []
        for e in sorted(thread_events, key=lambda e: (e["ts"], -e.get("dur", 0))):
            start, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
            while stack and start >= stack[-1].end:
                stack.pop()
            parent = stack[-1] if stack else None
            label = _label(e["name"])
            op = Op(e["name"], start, end, backward=label == "backward" or bool(parent and parent.backward),
                    phase=(parent.phase if parent and parent.phase else label),
                    graph=e["name"].startswith(GRAPH_CALL) or bool(parent and parent.graph))
            stack.append(op)
            ext = (e.get("args") or {}).get("External id")
            if ext:
                ops[ext] = op
    return ops


def trace_kernels(events: list[dict]) -> tuple[list[Kernel], list[Span], int]:
    """(the GPU kernels and copies of the trace, each placed by the op that launched it; the spans of
    its STEP_RANGE ranges; how many kernels link to no op, never counted as the backward's).

    Each GPU event carries the "External id" of the op that launched it, Inductor's Triton kernels
    included (each launch is an op named after its kernel, inside the graph's call).
    No GPU span is needed for a compiled graph (the trace gives none for "## Call CompiledFxGraph": a
    cpu_op, not a user annotation), and no profiler object: a torch whose FunctionEvent keeps no
    linked_correlation_id links nothing there (wave 8, torch 2.11: all 5,562 kernels unlinked, NCCL
    and memcpy kernels included)."""
    ops = trace_ops(events)
    windows = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                     if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e.get("name") == STEP_RANGE)
    # the host's launch calls by CUPTI correlation id: how far the GPU runs behind the host
    launches = {e["args"]["correlation"]: float(e["ts"]) for e in events if e.get("ph") == "X"
                and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in (e.get("args") or {})}
    kernels, unlinked = [], 0
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_WORK:
            continue
        args = e.get("args") or {}
        op = ops.get(args.get("External id"))
        unlinked += op is None
        start = float(e["ts"])
        nbytes = int(args.get("In msg nelems") or 0) * DTYPE_BYTES.get(args.get("dtype"), 0)
        kernels.append(Kernel(e["name"], start, start + float(e.get("dur", 0)), backward=bool(op and op.backward),
                              stream=args.get("stream", e.get("tid", 0)), phase=op.phase if op else "",
                              collective=args.get("Collective name", ""), nbytes=nbytes, graph=bool(op and op.graph),
                              launched=launches.get(args.get("correlation"))))
    kernels.sort(key=lambda k: k.start)
    return kernels, windows, unlinked


def profiled_steps(events: list[dict]) -> tuple[list[list[Kernel]], int, int]:
    """(the kernels of each STEP_RANGE range of a trace's events, how many started outside every
    range, how many link to no op)."""
    kernels, windows, unlinked = trace_kernels(events)
    steps, outside = split_by_step(kernels, windows)
    return steps, outside, unlinked


def describe_overlap(per_step: list[dict], outside: int, unlinked: int) -> list[str]:
    """The printout: each step's figures, then their means."""
    lines = ["Communication (NCCL kernels) against compute kernels, per profiled step (ms):"]
    if not per_step:
        return lines + ["  no profiled step found (no kernel inside a bench step range)"]
    for i, s in enumerate([*per_step, mean_overlap(per_step)]):
        label = f"step {i + 1}" if i < len(per_step) else "mean"
        lead = s["comm_lead_ms"]
        if lead is None:
            lead_text = "-"
        else:
            lead_text = f"{lead:+.2f} ({'starts inside the backward' if lead > 0 else 'starts after the backward'})"
        share = f" ({s['overlapped_ms'] / s['comm_ms']:.0%})" if s["comm_ms"] else ""
        lines.append(f"  {label:7s} NCCL {s['comm_ms']:8.2f} | under compute {s['overlapped_ms']:8.2f}{share} | "
                     f"exposed {s['exposed_ms']:8.2f} | last backward kernel end - first NCCL start {lead_text}")
    if not any(s["comm_ms"] for s in per_step):
        lines.append("  (no NCCL kernel: one rank, or a strategy without communication)")
    if unlinked:
        lines.append(f"  ({unlinked} kernel(s) not linked to the op that launched them: none of them counts as the "
                     f"backward's)")
    if outside:
        lines.append(f"  ({outside} kernel(s) started outside the profiled steps and are not counted)")
    return lines
