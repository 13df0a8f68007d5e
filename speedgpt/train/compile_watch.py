"""What torch.compile did, span by span of a run (each stage's warmup steps, validation, training):
graphs compiled, recompiles and why, seconds spent compiling and in which phase of the compiler. The start
log prints it and the metrics keep it (event "compile"), so a change that adds a graph shows up in the first
minute.

Counts come from torch._dynamo's counters (frames, unique graphs); seconds, their phases and the cache hits from
compile_breakdown.py; the reason of each recompile from dynamo's "recompiles" log, which is switched on for the
run (unless TORCH_LOGS already chose its logs: then the user's choice stands and the reasons are only counted);
the slowest Triton kernel compiles from torch's record of each compile (kernel_compile_seconds: which kernels the
"kernels" phase may wait for, e.g. flex attention's templates).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import compile_breakdown

RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"
COMPILE_RECORDS_KEPT = 512
AFTER_WARMUP = "after the warmup"  # the span of the measured steps: anything compiled there cost training time
# the run's validations: what compiles there the warmup missed too (it costs wall time, not training time)
VALIDATION_AFTER_WARMUP = "validation after the warmup"


@dataclass
class Span:
    """One labelled part of the run: what dynamo compiled while it ran."""

    label: str
    graphs: int = 0
    frames: int = 0
    wall_s: float = 0.0
    recompiles: list[str] = field(default_factory=list)  # one reason per recompile
    timers: dict = field(default_factory=dict)  # torch's compile timers and cache counters (compile_breakdown)
    kernel_compile_s: dict = field(default_factory=dict)  # "kernel [compile]" -> its seconds (kernel_compile_seconds)

    def breakdown(self) -> dict:
        """compile_s, its phases, first-call autotune and cache counts (compile_breakdown.phases)."""
        return compile_breakdown.phases(self.timers)

    @property
    def compile_s(self) -> float:
        return self.breakdown()["compile_s"]

    def as_record(self) -> dict:
        return {"label": self.label, "graphs": self.graphs, "frames": self.frames, "recompiles": len(self.recompiles),
                "reasons": self.recompiles, **compile_breakdown.rounded(self.breakdown()),
                "wall_s": round(self.wall_s, 3), "slowest_kernels": slowest_kernels(self.kernel_compile_s, 5)}


def compile_events() -> list:
    """torch's record of each compile so far (dynamo's CompilationMetrics, oldest first: a frame's, a lazily compiled
    backward's), or [] where this torch keeps none."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return []
    return get_compilation_metrics()


def events_after(events: list, last) -> list:
    """The events after `last` (the newest one a span started with, None if none): compared by identity; if torch's
    bounded list has dropped `last`, every event it holds came after it."""
    at = next((i for i in range(len(events) - 1, -1, -1) if events[i] is last), None) if last is not None else None
    return events if at is None else events[at + 1:]


def kernel_compile_seconds(events) -> dict[str, float]:
    """Triton kernels' compile seconds, from each compile's list of its slowest (torch keeps 25 a compile:
    `triton_kernel_compile_times_us`, JSON [[name, us], ...]), keyed "name [compile id]" (" bwd" for a lazily
    compiled backward): kernel names restart in every graph. Each is the kernel's own time in its worker; kernels
    compile in parallel and while Inductor still generates code, so these are neither a sum nor a bound of the
    "kernels" phase's wait, only where to look: one near that wait is the likely cause. Kernels compiled outside a
    compile (a precompiled package's install, autotuning) are not listed. A list of another shape (a torch that
    changed it, or its "<unknown>") is skipped: a diagnostic never stops a run."""
    out: dict[str, float] = {}
    for event in events:
        raw = getattr(event, "triton_kernel_compile_times_us", None)
        where = f"{getattr(event, 'compile_id', '?')}{' bwd' if getattr(event, 'is_forward', None) is False else ''}"
        try:
            pairs = [(f"{name} [{where}]", float(us) / 1e6) for name, us in json.loads(raw)] if raw else []
        except (ValueError, TypeError, OverflowError):
            continue
        keep_longest(out, pairs)
    return out


def keep_longest(into: dict[str, float], more) -> None:
    """Adds the (kernel, seconds) pairs `more` to `into`; a kernel listed twice keeps its longer time."""
    for key, sec in more:
        into[key] = max(into.get(key, 0.0), sec)


def slowest_kernels(kernel_compile_s: dict[str, float], n: int) -> list[list]:
    """The n slowest as [["kernel [compile]", seconds], ...], slowest first."""
    return [[key, round(sec, 3)] for key, sec in sorted(kernel_compile_s.items(), key=lambda kv: -kv[1])[:n]]


SLOWEST_KERNELS = "slowest kernel compiles (each its own seconds, in parallel workers)"


def describe_kernels(slowest: list[list]) -> str:
    """slowest_kernels' list as the start log and bench print it: "NAME [COMPILE] 21.0s, ..."."""
    return ", ".join(f"{key} {sec:.1f}s" for key, sec in slowest)


class _Reasons(logging.Handler):
    """Keeps the first guard failure of each "Recompiling function ..." message: why it recompiled."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.append(recompile_reason(record.getMessage()))


def recompile_reason(message: str) -> str:
    """'forward: tensor 'inputs_BT' size mismatch at index 0. expected 2, actual 1' from dynamo's message
    (its function, then the newest cache entry's first failed guard, without the source comment)."""
    func = re.search(r"Recompiling function (\S+)", message)
    guard = re.search(r"^\s*- \d+/\d+: (.*)$", message, re.M)
    what = guard.group(1).split("  #")[0].strip() if guard else message.splitlines()[0]
    return f"{func.group(1) if func else '?'}: {what}"


class CompileWatch:
    """Spans of the run (`with watch.span("stage 0"): ...`); `lines()` and `record()` say what each compiled."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.spans: list[Span] = []
        self._handler: _Reasons | None = None
        if enabled:
            self._listen()

    def _listen(self) -> None:
        import torch._logging

        logger = logging.getLogger(RECOMPILES_LOGGER)
        if not os.environ.get("TORCH_LOGS"):
            torch._logging.set_logs(recompiles=True)
            logger.propagate = False  # ours to summarize, not torch's to print (TORCH_LOGS=recompiles prints them)
        self._handler = _Reasons()
        logger.addHandler(self._handler)
        from torch._dynamo import utils as dynamo_utils

        # torch keeps its newest 64 compile records; per-block compiles (fsdp, compile_scope=block) make more in a
        # span, and the kernel list reads them after it (a few KB each)
        kept = getattr(getattr(dynamo_utils, "_compilation_metrics", None), "maxlen", None) or 0
        if hasattr(dynamo_utils, "set_compilation_metrics_limit") and kept < COMPILE_RECORDS_KEPT:
            dynamo_utils.set_compilation_metrics_limit(COMPILE_RECORDS_KEPT)

    def close(self) -> None:
        if self._handler is not None:
            logging.getLogger(RECOMPILES_LOGGER).removeHandler(self._handler)
            self._handler = None

    @staticmethod
    def _counts() -> tuple[int, int, dict]:
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"], counters["frames"]["total"], compile_breakdown.snapshot()

    @contextmanager
    def span(self, label: str):
        """Count what compiles inside the block under `label` (spans of the same label add up)."""
        if not self.enabled:
            yield
            return
        graphs, frames, timers = self._counts()
        events = compile_events()
        newest = events[-1] if events else None
        n_reasons, t0 = len(self._handler.reasons), time.perf_counter()
        try:
            yield
        finally:
            g, f, t = self._counts()
            span = next((x for x in self.spans if x.label == label), None)
            if span is None:
                span = Span(label, timers={k: 0.0 for k in t})
                self.spans.append(span)
            span.graphs += g - graphs
            span.frames += f - frames
            span.timers = compile_breakdown.combine(span.timers, compile_breakdown.combine(t, timers, -1))
            span.wall_s += time.perf_counter() - t0
            span.recompiles += self._handler.reasons[n_reasons:]
            keep_longest(span.kernel_compile_s, kernel_compile_seconds(events_after(compile_events(), newest)).items())

    def spans_compiled(self, label: str) -> bool:
        """Whether the span `label` compiled any frame."""
        return any(s.label == label and s.frames for s in self.spans)

    def total(self) -> Span:
        out = Span("total")
        for s in self.spans:
            out.graphs, out.frames, out.wall_s = out.graphs + s.graphs, out.frames + s.frames, out.wall_s + s.wall_s
            out.recompiles += s.recompiles
            out.timers = compile_breakdown.combine(s.timers, out.timers) if out.timers else dict(s.timers)
            keep_longest(out.kernel_compile_s, s.kernel_compile_s.items())
        return out

    def lines(self) -> list[str]:
        """The start log's summary: one line in all and one with where its seconds went, one per span that
        compiled (its phases too), one per distinct reason."""
        if not self.enabled:
            return []
        t = self.total()
        lines = [f"compile: {t.graphs} graph(s) from {t.frames} frame(s), {len(t.recompiles)} recompile(s), "
                 f"{t.compile_s:.1f}s compiling",
                 f"  compile time: {compile_breakdown.describe(t.breakdown())}"]
        if t.kernel_compile_s:
            lines.append(f"  {SLOWEST_KERNELS}: {describe_kernels(slowest_kernels(t.kernel_compile_s, 5))}")
        for s in self.spans:
            if s.frames:
                lines.append(f"  {s.label}: {s.graphs} graph(s), {len(s.recompiles)} recompile(s), "
                             f"{s.compile_s:.1f}s compiling ({compile_breakdown.describe_phases(s.breakdown())}), "
                             f"{s.wall_s:.1f}s in all")
        for reason in dict.fromkeys(t.recompiles):
            lines.append(f"  recompiled ({t.recompiles.count(reason)}x): {reason}")
        return lines

    def record(self) -> dict:
        """The metrics record (event "compile"): the whole warmup's counts and breakdown, then each span's."""
        t = self.total()
        return {"graphs": t.graphs, "frames": t.frames, "recompiles": len(t.recompiles),
                **compile_breakdown.rounded(t.breakdown()), "slowest_kernels": slowest_kernels(t.kernel_compile_s, 10),
                "spans": [s.as_record() for s in self.spans]}
