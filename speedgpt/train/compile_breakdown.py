"""Where torch.compile's seconds go (issue 33): dynamo's tracing, AOTAutograd, Inductor's lowering and codegen,
waiting for kernels to compile, autotuning, and the FX-graph / AOTAutograd cache hits, read from torch's own
instrumentation. compile_watch.py takes a snapshot before and after each span of a run; the difference says
what that span's compiles spent where.

Torch times its compiler with `dynamo_timed(key)`, which appends each call's seconds to
`torch._dynamo.utils.compilation_time_metrics[key]` (what `torch._dynamo.utils.compile_times()` prints), and
counts cache hits in `torch._dynamo.utils.counters`. The timers nest, so each phase is its timer less the
timers inside it, and the phases add up to the compile time (a frame's compile plus its lazy backward):

    frame compile (_compile.compile_inner) + backward compile (backward._backward_impl)
    |- trace     the frame less its backend call: dynamo tracing bytecode into a graph, guards
    |- aot       the backend call and the backward less Inductor: AOTAutograd's joint trace, partition,
    |            cache lookups
    |- inductor  Inductor's compiles (compile_fx_inner) and loads from the AOTAutograd cache, less the two
    |            below: lowering, fusion, code generation, loading the generated modules
    |- kernels   waiting for the kernels' compilation (parallel workers) or compiling them in process
    '- autotune  autotuning while compiling: template choices (mm, flex attention), benchmarked fusions
Triton's autotuning at a kernel's first launch (more configs than one, coordinate descent) runs after the
compile, when the compiled code first runs: it is reported beside the phases (`first_call_autotune_s`),
outside the compile time.

Timer keys are internal to torch. Each is looked up in the torch source file that names it (checked for
torch 2.11 and 2.13): a phase whose timers this torch does not name reads None ("n/a"), never 0, and its
seconds stay in the phase around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Timer:
    """A dynamo_timed key and the torch source file (relative to torch's folder) that names it; `suffix`:
    every key ending so (one per template, e.g. flex_attention_template_autotuning); `since`: the first torch
    (major, minor) checked to name it."""

    key: str
    source: str
    suffix: bool = False
    since: tuple[int, int] = (2, 11)


# The timer groups a breakdown reads; see the tree in the module's docstring for how they nest.
TIMERS: dict[str, tuple[Timer, ...]] = {
    "frame": (Timer("_compile.compile_inner", "_dynamo/convert_frame.py"),),
    "backward": (Timer("backward._backward_impl", "_functorch/_aot_autograd/runtime_wrappers.py"),),
    "backend": (Timer("OutputGraph.call_user_compiler", "_dynamo/output_graph.py"),),
    "inductor": (Timer("compile_fx_inner", "_inductor/compile_fx.py"),
                 Timer("AOTAutogradCache.inductor_load", "_functorch/_aot_autograd/aot_autograd_result.py")),
    # only the wait shows on the clock: kernels compile in worker processes while Inductor generates code
    "kernels": (Timer("async_compile.wait", "_inductor/async_compile.py"),
                Timer("async_compile.precompile", "_inductor/async_compile.py")),
    "autotune": (Timer("_template_autotuning", "_inductor/select_algorithm.py", suffix=True),
                 Timer("_template_precompiling", "_inductor/select_algorithm.py", suffix=True),
                 Timer("benchmark_fused_nodes", "_inductor/scheduler.py")),
    "first_call_autotune": (
        Timer("CachingAutotuner.benchmark_all_configs", "_inductor/runtime/triton_heuristics.py"),
        Timer("CachingAutotuner.coordinate_descent_tuning", "_inductor/runtime/triton_heuristics.py"),
        Timer("CachingAutotuner.combo_sequential_autotune", "_inductor/runtime/triton_heuristics.py",
              since=(2, 13))),
}
# (counters section, counter name, torch source file that counts it)
COUNTERS: dict[str, tuple[str, str, str]] = {
    "fx_cache_hits": ("inductor", "fxgraph_cache_hit", "_inductor/codecache.py"),
    "fx_cache_misses": ("inductor", "fxgraph_cache_miss", "_inductor/codecache.py"),
    "aot_cache_hits": ("aot_autograd", "autograd_cache_hit", "_functorch/_aot_autograd/autograd_cache.py"),
    "aot_cache_misses": ("aot_autograd", "autograd_cache_miss", "_functorch/_aot_autograd/autograd_cache.py"),
}
PHASES = ("trace", "aot", "inductor", "kernels", "autotune")


@cache
def _source(relative: str) -> str:
    """A torch source file's text ('' when this torch has no such file). Read, not imported: a run compiled
    with the eager backend never imports Inductor, and a breakdown must not either."""
    import torch

    path = Path(torch.__file__).parent / relative
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


@cache
def names(key: str, relative: str, suffix: bool = False) -> bool:
    """Whether this torch's source file `relative` names `key` as a string (a timer key or counter name).
    Cached: `snapshot` asks around every training step (compile_watch's span), and the answer is the process's."""
    return (f'{key}"' if suffix else f'"{key}"') in _source(relative)


def snapshot() -> dict[str, float | None]:
    """Torch's totals so far: seconds per timer group and each cache counter; None where this torch does not
    name the group's timers (or the counter)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    metrics = dict(compilation_time_metrics)  # a copy: a compile worker thread may add a key meanwhile
    out: dict[str, float | None] = {}
    for group, timers in TIMERS.items():
        known = [t for t in timers if names(t.key, t.source, t.suffix)]
        if not known:
            out[group] = None
            continue
        total = 0.0
        for t in known:
            keys = [k for k in metrics if k.endswith(t.key)] if t.suffix else [t.key]
            total += sum(sum(metrics.get(k, ())) for k in keys)
        out[group] = total
    for name, (section, counter, source) in COUNTERS.items():
        out[name] = float(counters[section][counter]) if names(counter, source) else None
    return out


def combine(a: dict, b: dict, sign: int = 1) -> dict:
    """a + sign * b per entry (None, not exposed, in either stays None): spans' differences and sums."""
    return {k: None if a.get(k) is None or b.get(k) is None else a[k] + sign * b[k] for k in a}


def phases(raw: dict) -> dict:
    """A breakdown from `raw` (a snapshot, or a difference of two): `compile_s`, each phase's seconds
    (`trace_s` ... `autotune_s`, disjoint, adding up to compile_s), `first_call_autotune_s` (outside compile_s)
    and the cache counts; None for what this torch does not expose."""
    frame, backward, backend = raw.get("frame") or 0.0, raw.get("backward") or 0.0, raw.get("backend")
    inductor, kernels, autotune = raw.get("inductor"), raw.get("kernels"), raw.get("autotune")
    out: dict = {"compile_s": frame + backward, "trace_s": None, "aot_s": None, "inductor_s": None,
                 "kernels_s": None, "autotune_s": None}
    if backend is not None and raw.get("frame") is not None:
        out["trace_s"] = frame - backend
        out["aot_s"] = backend + backward - (inductor or 0.0)
    if inductor is not None:  # kernels and autotune are timed inside Inductor's compiles
        out["kernels_s"], out["autotune_s"] = kernels, autotune
        out["inductor_s"] = inductor - (kernels or 0.0) - (autotune or 0.0)
    out["first_call_autotune_s"] = raw.get("first_call_autotune")
    for name in COUNTERS:
        out[name] = None if raw.get(name) is None else int(raw[name])
    return out


def rounded(p: dict) -> dict:
    """A breakdown for a metrics record: seconds to the millisecond."""
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()}


def _seconds(v) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def describe_phases(p: dict) -> str:
    """'trace 12.1, aot 8.3, inductor 40.2, kernels 60.0, autotune 10.0 s' ("n/a": torch does not expose it)."""
    return ", ".join(f"{name} {_seconds(p[f'{name}_s'])}" for name in PHASES) + " s"


def describe(p: dict) -> str:
    """describe_phases, then '; first-call autotune 3.0 s; fx graph cache 0/37 hits, aot autograd cache 0/4
    hits'."""

    def hits(h, m) -> str:
        return "n/a" if h is None or m is None else f"{h}/{h + m} hits"

    return (f"{describe_phases(p)}; first-call autotune {_seconds(p['first_call_autotune_s'])} s; "
            f"fx graph cache {hits(p['fx_cache_hits'], p['fx_cache_misses'])}, "
            f"aot autograd cache {hits(p['aot_cache_hits'], p['aot_cache_misses'])}")
