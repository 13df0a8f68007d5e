"""The report `speedgpt bench --profile` prints, read again from a saved profile trace, on any machine:
GPU time by kernel category, communication against compute per profiled step, and each step's
timeline (compute-stream phases, its waits on NCCL and idle time, the collectives against the
backward's end).

    python benchmarks/trace_report.py TRACE [--each]

TRACE: a Chrome trace written by `bench --profile N --profile-trace DIR` (DIR/profile-A.json.gz) or by
torch.profiler's export_chrome_trace. --each also lists every collective kernel (start and end
against the backward's last kernel, duration, bytes, the phase that launched it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from speedgpt.bench import print_kernel_categories  # noqa: E402
from speedgpt.kernel_timeline import load_trace, profiled_steps  # noqa: E402
from speedgpt.step_timeline import trace_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a profile trace (.json or .json.gz)")
    p.add_argument("--each", action="store_true", help="list every collective kernel of each step")
    args = p.parse_args(argv)
    if not Path(args.trace).is_file():
        p.error(f"{args.trace}: no such file; give a trace written by bench --profile-trace DIR")
    try:
        events = load_trace(args.trace)
    except ValueError as e:
        p.error(str(e))
    steps, outside, unlinked = profiled_steps(events)
    if not steps:
        p.error(f"{args.trace}: no speedgpt.bench.step range; give a trace of bench --profile")
    print_kernel_categories([k for s in steps for k in s], steps=len(steps))
    lines, _ = trace_report(steps, outside, unlinked, each=args.each)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
