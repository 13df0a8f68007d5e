"""Cut tests/fixtures/profile_4gpu_excerpt.json from a bench profile trace: a few kernels of one
profiled step of rank 0 and everything that places them (their launching ops, the ranges around
those on their thread, their launch calls, the step's range), the arguments kernel_timeline reads
and nothing else.

    python scripts/cut_trace_fixture.py /work/w8share/profile-A.json.gz tests/fixtures/profile_4gpu_excerpt.json

The source: wave 8's `torchrun --nproc_per_node=4 -m speedgpt bench --preset speedrun-124m --profile 10
--profile-trace DIR` on 4 x H100 (torch 2.11, commit 29d9089), profile-A (reduce-scatters in the parameters'
dtypes). Kept, from its 2nd profiled step: the first forward graph's first 3 kernels, the last backward graph's last 3, the
backward's last kernel (a bucket's packing, outside the graph), the first 2 reduce-scatters, and the
Muon step's first 2 kernels and first all-gather.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.kernel_timeline import (CPU_RANGES, DEVICE_WORK, STEP_RANGE, load_trace,  # noqa: E402
                                      trace_kernels)

KEEP_ARGS = ("External id", "correlation", "stream", "Collective name", "In msg nelems", "dtype")
STEP = 1  # the second profiled step: the first one pays the profiler's start


def pick(kernels, window):
    """The kernels to keep, as (start, name) keys."""
    ks = [k for k in kernels if window[0] <= k.start < window[1]]
    compute = [k for k in ks if not k.is_comm and not k.is_copy]
    forward = [k for k in compute if k.phase == "forward"][:3]
    graph_bwd = [k for k in compute if k.backward and k.graph][-3:]
    last_bwd = [max((k for k in compute if k.backward), key=lambda k: k.end)]
    rs = [k for k in ks if k.is_comm and k.collective == "_reduce_scatter_base"][:2]
    muon = [k for k in compute if k.phase == "optimizer DistMuon"][:2]
    ag = [k for k in ks if k.is_comm and k.phase == "optimizer DistMuon"][:1]
    return {(k.start, k.name) for k in forward + graph_bwd + last_bwd + rs + muon + ag}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: cut_trace_fixture.py SOURCE_TRACE OUT_JSON", file=sys.stderr)
        return 2
    events = load_trace(argv[0])
    kernels, windows, _ = trace_kernels(events)
    window = windows[STEP]
    keep = pick(kernels, window)
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_WORK
           and (float(e["ts"]), e["name"]) in keep]
    ext = {e["args"]["External id"] for e in gpu}
    corr = {e["args"]["correlation"] for e in gpu}
    cpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in CPU_RANGES]
    launchers = [e for e in cpu if e["args"].get("External id") in ext]

    def encloses(outer, inner):
        return (outer["tid"] == inner["tid"] and outer["ts"] <= inner["ts"]
                and outer["ts"] + outer["dur"] >= inner["ts"] + inner["dur"])

    ranges = [e for e in cpu if any(encloses(e, op) for op in launchers)]  # the launchers and all around them
    step = [e for e in cpu if e["name"] == STEP_RANGE and float(e["ts"]) == window[0]]
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
             and e.get("args", {}).get("correlation") in corr]
    out = []
    for e in sorted({id(e): e for e in step + ranges + gpu + calls}.values(), key=lambda e: e["ts"]):
        e = {k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur")}, e.get("args", {})
        out.append({**e[0], "args": {k: v for k, v in e[1].items() if k in KEEP_ARGS}})
    Path(argv[1]).write_text(json.dumps({"traceEvents": out}, indent=0) + "\n")
    print(f"{argv[1]}: {len(out)} events ({len(gpu)} GPU) from {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
