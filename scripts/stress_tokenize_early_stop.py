"""Run tokenization's early stop (max_tokens reached with chunks still in flight) many times.

Each iteration is a child process that tokenizes a synthetic corpus of many ~1 MB chunks on a
pool of workers and stops after the first chunk, so the stop always happens with tasks in flight
(the path that once hung in pool shutdown). The parent gives each child a generous deadline and
counts a child that misses it as a hang (its Python stacks are printed), so this script itself
never hangs.

    python scripts/stress_tokenize_early_stop.py --iterations 200 --workers 2

Prints one line: runs, ok, hangs, failures, seconds. Exit status 1 if any run hung or failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child(out_dir: str, workers: int, deadline_s: float) -> None:
    import faulthandler

    # Dump every thread's stack shortly before the parent gives up, to show where a hang sits.
    faulthandler.dump_traceback_later(max(deadline_s - 5, 1), exit=False)
    from speedgpt.data.corpus import Documents
    from speedgpt.data.tokenize import tokenize_corpus

    words = " ".join(f"word{i} value_{i % 97} = f({i});\n" for i in range(12_000))  # ~300 KB of text
    texts = [f"doc {i}\n{words}" for i in range(40)]  # ~12 MB: a dozen 1 MB chunks
    m = tokenize_corpus(Documents(texts), out_dir, max_tokens=1000, workers=workers, progress=False)
    assert m["stopped_early"] and m["documents"] == 1, m


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=200, help="runs of the early-stop path (default 200)")
    p.add_argument("--workers", type=int, default=2, help="tokenizer worker processes (default 2)")
    p.add_argument("--deadline", type=float, default=120.0,
                   help="seconds one run may take before it counts as a hang (default 120; a run takes a few)")
    p.add_argument("--child", metavar="OUT_DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.workers, args.deadline)
        return 0

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    hangs = failures = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.iterations):
            cmd = [sys.executable, __file__, "--child", str(Path(tmp) / "out"), "--workers", str(args.workers),
                   "--deadline", str(args.deadline)]
            # A new session, so a hung child and its workers can be killed as one group.
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            try:
                out, _ = proc.communicate(timeout=args.deadline)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                out, _ = proc.communicate()
                hangs += 1
                print(f"run {i}: HANG (no exit within {args.deadline:.0f} s); its stacks:\n{out[-4000:]}", flush=True)
                continue
            if proc.returncode != 0:
                failures += 1
                print(f"run {i}: FAILED (exit {proc.returncode}):\n{out[-2000:]}", flush=True)
    seconds = time.perf_counter() - start
    runs = args.iterations
    print(f"runs={runs} ok={runs - hangs - failures} hangs={hangs} failures={failures} "
          f"workers={args.workers} seconds={seconds:.0f} ({seconds / max(runs, 1):.1f} s/run)")
    return 1 if hangs or failures else 0


if __name__ == "__main__":
    sys.exit(main())
