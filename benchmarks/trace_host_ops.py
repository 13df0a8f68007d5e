"""The host's side of profiled steps, from a saved profile trace: the calls that wait for the GPU (host
syncs) and the op that made each, and what the host launches eagerly (outside a compiled graph's call)
before each forward graph. The GPU-side report of the same trace is benchmarks/trace_report.py.

    python benchmarks/trace_host_ops.py TRACE [--ops N]

TRACE: a Chrome trace written by `bench --profile N --profile-trace DIR` (DIR/profile-A.json.gz). Per step:
each sync call (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, a blocking cudaMemcpy),
its thread (the autograd engine's is the backward's) and innermost op; then, per forward graph call on the
thread that ran the step, the host time since the previous graph call (or the step's start) and the eager
ops launched in it, counted by name (N most frequent), with their kernel launches and copies. bench's own
sync at each profiled step's end is a cudaDeviceSynchronize outside the step's range: not listed.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.kernel_timeline import CPU_RANGES, GRAPH_CALL, STEP_RANGE, load_trace  # noqa: E402

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
COPIES = ("cudaMemcpyAsync", "cudaMemsetAsync")


def _span(e: dict) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))


def _enclosing(ops: list[dict], ts: float) -> list[dict]:
    """The ops around the instant `ts` on one thread, outermost first."""
    return sorted((e for e in ops if _span(e)[0] <= ts <= _span(e)[1]), key=lambda e: -e.get("dur", 0))


def _named(ops: list[dict], ts: float) -> str:
    """The operator that made the call at `ts`: the outermost named op around it ("aten::to", a custom op
    "speedgpt::..."), with the innermost beside it when that is another ("aten::to > aten::copy_")."""
    around = [e["name"] for e in _enclosing(ops, ts) if e.get("cat") == "cpu_op" and "::" in e["name"]]
    if not around:
        return "-"
    return around[0] if len(around) == 1 else f"{around[0]} > {around[-1]}"


def _outermost_within(ops: list[dict], a: float, b: float) -> list[dict]:
    """The ops that lie wholly inside [a, b) and inside no other such op."""
    inside = sorted((e for e in ops if a <= _span(e)[0] and _span(e)[1] <= b),
                    key=lambda e: (e["ts"], -e.get("dur", 0)))
    out, end = [], a
    for e in inside:
        if _span(e)[0] >= end:
            out.append(e)
            end = _span(e)[1]
    return out


def host_report(events: list[dict], top: int = 8) -> list[str]:
    """The printout for every profiled step of `events` (see the module's docstring); ValueError without one."""
    xs = [e for e in events if e.get("ph") == "X"]
    steps = sorted((e for e in xs if e.get("cat") == "user_annotation" and e.get("name") == STEP_RANGE),
                   key=lambda e: e["ts"])
    if not steps:
        raise ValueError(f"no {STEP_RANGE} range in the trace: give one written by bench --profile-trace")
    main = steps[0].get("tid")
    ops = [e for e in xs if e.get("cat") in CPU_RANGES and e.get("name") != STEP_RANGE]
    by_tid: dict = {}
    for e in ops:
        by_tid.setdefault(e.get("tid"), []).append(e)
    runtime = sorted((e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    lines = []
    for n, step in enumerate(steps, 1):
        lo, hi = _span(step)
        t0 = lo
        syncs = [e for e in runtime if e["name"] in SYNC_CALLS and lo <= e["ts"] <= hi]
        lines.append(f"step {n}: {(hi - lo) / 1e3:.2f} ms on the host; {len(syncs)} host sync call(s)")
        for e in syncs:
            thread = "main" if e.get("tid") == main else f"thread {e.get('tid')} (autograd: the backward's)"
            where = _named(by_tid.get(e.get("tid"), []), e["ts"])
            if where == "-" and e["name"] == "cudaDeviceSynchronize":
                where = "torch.cuda.synchronize() (bench --profile's own, at each step's end)"
            lines.append(f"  sync {e['name']:22s} at {(e['ts'] - t0) / 1e3:8.2f} ms, "
                         f"waited {e.get('dur', 0) / 1e3:6.2f} ms, {thread}, in {where}")
        mine = sorted((e for e in by_tid.get(main, []) if lo <= e["ts"] <= hi), key=lambda e: e["ts"])
        calls = [e for e in mine if e["name"].startswith(GRAPH_CALL)]
        graph_spans = [_span(c) for c in calls]
        start = lo
        for k, call in enumerate(calls, 1):
            a, b = start, float(call["ts"])
            start = _span(call)[1]
            if any(x[0] < a < x[1] for x in graph_spans) or b <= a:
                continue

            def eager(ts: float) -> bool:
                return a <= ts < b and not any(x[0] <= ts <= x[1] for x in graph_spans)

            launched = [e for e in runtime if e.get("tid") == main and eager(e["ts"])]
            kernels = sum(e["name"] in LAUNCHES for e in launched)
            copies = sum(e["name"] in COPIES for e in launched)
            names = Counter(_named(mine, e["ts"]).split(" > ")[0] for e in launched if e["name"] in LAUNCHES + COPIES)
            common = ", ".join(f"{name} x{c}" for name, c in names.most_common(top))
            # the host's own time: its outermost ops in the gap, summed (a backward between two forwards is
            # the autograd thread's; the main thread only waits for it)
            host_ms = sum(e.get("dur", 0) for e in _outermost_within(mine, a, b)) / 1e3
            lines.append(f"  before graph call {k} at {(b - t0) / 1e3:.2f} ms: {kernels} kernel launches, {copies} "
                         f"copies/memsets, ops taking {host_ms:.2f} ms of host time: {common or '-'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", metavar="TRACE", help="a profile trace (.json or .json.gz)")
    p.add_argument("--ops", type=int, default=8, help="eager ops named per gap, most frequent first (default 8)")
    args = p.parse_args(argv)
    if args.ops < 1:
        p.error(f"--ops {args.ops}: must be >= 1")
    if not Path(args.trace).is_file():
        what = "a folder, not a trace file" if Path(args.trace).is_dir() else "no such file"
        p.error(f"{args.trace}: {what}; give a trace written by bench --profile-trace DIR (DIR/profile-A.json.gz)")
    try:
        lines = host_report(load_trace(args.trace), args.ops)
    except ValueError as e:
        p.error(f"{args.trace}: {e}" if args.trace not in str(e) else str(e))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
