"""The report `speedgpt bench --profile` prints, read again from saved profile traces, on any machine:
GPU time by kernel category, communication against compute per profiled step, and each step's
timeline (compute-stream phases, its waits on NCCL and idle time, the collectives against the
backward's end); given several traces (the ranks of one run), a line per rank and step beside.

    python benchmarks/trace_report.py TRACE [TRACE ...] [--each]

TRACE: a Chrome trace written by `bench --profile N --profile-trace DIR` (DIR/profile-A.json.gz, rank r's
DIR/profile-A-rank<r>.json.gz) or by torch.profiler's export_chrome_trace. --each also lists every
collective kernel (start and end against the backward's last kernel, duration, bytes, the phase that
launched it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.bench import print_kernel_categories  # noqa: E402
from speedgpt.kernel_timeline import load_trace, profiled_steps  # noqa: E402
from speedgpt.step_timeline import compare_traces, trace_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE", help="a profile trace (.json or .json.gz)")
    p.add_argument("--each", action="store_true", help="list every collective kernel of each step")
    args = p.parse_args(argv)
    read = []
    for trace in args.traces:  # all read before any printout: a bad one fails alone, at once
        if not Path(trace).is_file():
            what = "a folder, not a trace file" if Path(trace).is_dir() else "no such file"
            p.error(f"{trace}: {what}; give a trace written by bench --profile-trace DIR (DIR/profile-A.json.gz)")
        try:
            events = load_trace(trace)
        except ValueError as e:
            p.error(str(e))
        steps, outside, unlinked = profiled_steps(events)
        if not steps:
            p.error(f"{trace}: no speedgpt.bench.step range; give a trace of bench --profile")
        read.append((trace, steps, outside, unlinked))
    for trace, steps, outside, unlinked in read:
        print(f"== {trace}")
        print_kernel_categories([k for s in steps for k in s], steps=len(steps))
        print("\n".join(trace_report(steps, outside, unlinked, each=args.each)[0]))
    if len(read) > 1:
        print("\n".join(compare_traces([(trace, steps) for trace, steps, _, _ in read])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
