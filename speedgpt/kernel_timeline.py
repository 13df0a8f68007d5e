"""GPU kernels on a timeline, from torch.profiler: how much of the communication (NCCL kernels)
runs under compute kernels, per training step, and whether it starts inside the backward.

`speedgpt bench --profile N` prints these figures (docs/distributed.md). The arithmetic is on
plain (start, end) spans and is unit-tested on synthetic ones; `profiled_steps` is the only part
that reads profiler events.

Which kernel belongs to the backward: the profiler links each GPU kernel to the CPU op that
launched it (`linked_correlation_id`), and the autograd engine runs every backward node inside a
CPU range named "autograd::engine::evaluate_function: ...", so a kernel is the backward's when
that range encloses its launching op. Inductor's Triton kernels link to no op: for them the GPU
span the profiler gives each compiled graph's call says it (`graph_spans`). Which step a kernel
belongs to: bench wraps each profiled step in a CPU range named STEP_RANGE and waits for the GPU
before closing it, so a step's kernels start inside its range (the profiler puts CPU and GPU events
on one clock).
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

def device_kernels(prof):
    """The profiler's GPU-side events that are kernels or copies: not the GPU spans the profiler adds
    for user ranges (record_function, Inductor's graph calls), which would count their kernels twice."""
    import torch

    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA and not getattr(evt, "is_user_annotation", False) \
                and evt.name != STEP_RANGE:
            yield evt


def _is_backward(op) -> bool:
    while op is not None:
        if op.name.startswith(BACKWARD_RANGE):
            return True
        op = op.cpu_parent
    return False


def graph_spans(prof, cpu) -> tuple[list[Span], list[Span]]:
    """The GPU spans of the compiled graphs that ran inside the backward, and of the others. Inductor's
    kernels link to no CPU op, but the profiler gives each graph call (GRAPH_CALL, named by the graph's
    cache key) a GPU span too, and the call's CPU range says whether the autograd engine ran it: a name
    called only there is a backward graph."""
    import torch

    inside, outside = set(), set()
    for e in cpu:
        if e.name.startswith(GRAPH_CALL):
            (inside if _is_backward(e) else outside).add(e.name)
    backward, other = [], []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and getattr(e, "is_user_annotation", False) \
                and e.name.startswith(GRAPH_CALL):
            (backward if e.name in inside - outside else other).append((e.time_range.start, e.time_range.end))
    return merged(backward), merged(other)


def profiled_steps(prof) -> tuple[list[list[Kernel]], int, int]:
    """(the kernels of each STEP_RANGE range in `prof`, how many started outside every range, how
    many could be placed neither by the CPU op that launched it nor by a compiled graph's span: never
    counted as the backward's)."""
    import torch

    cpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    windows = sorted((e.time_range.start, e.time_range.end) for e in cpu if e.name == STEP_RANGE)
    # Frontend ops (linked to nothing themselves) carry the correlation id their kernels link to.
    # Id 0 is no correlation (and a torch without linked_correlation_id links nothing).
    launchers = {e.id: e for e in cpu if e.id and not getattr(e, "linked_correlation_id", 0) and not e.is_async}
    backward_graphs, other_graphs = graph_spans(prof, cpu)
    kernels, unlinked = [], 0
    for evt in device_kernels(prof):
        op = launchers.get(getattr(evt, "linked_correlation_id", 0) or -1)
        start, end = evt.time_range.start, evt.time_range.end
        if op is not None:
            backward = _is_backward(op)
        else:  # a compiled graph's kernel (Triton launches link to no op): its graph's span says
            backward = any(lo <= start < hi for lo, hi in backward_graphs)
            unlinked += not backward and not any(lo <= start < hi for lo, hi in other_graphs)
        kernels.append(Kernel(evt.name, start, end, backward))
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
