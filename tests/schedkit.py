"""The order of the collected tests under `pytest -n N --dist worksteal`: both workers finish together.

worksteal hands worker i the i-th of N consecutive, equally long runs of the collection, then moves
tests from the END of a busy worker's queue to an idle one. Left in file order, one worker's run may
hold most of the minute-long end-to-end tests while the other's holds none, and what is stolen late
is a slow test that then runs alone. So the modules with known slow tests (tests/slow_tests.txt,
pytest's own `--durations` lines) are dealt out longest first, each to the run with the fewest
seconds so far, at the START of that run; the fast tests fill each run up to its length, so late
steals take fast tests. A module stays whole (its module-scoped fixtures are built once).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

SLOW_TESTS = Path(__file__).parent / "slow_tests.txt"
# One line of `pytest --durations=N` output: "74.17s call     tests/test_x.py::test_y[param]".
DURATION_LINE = re.compile(r"^\s*(?P<seconds>\d+(?:\.\d+)?)s\s+(?:setup|call|teardown)\s+(?P<nodeid>\S+)\s*$")


def read_durations(text: str) -> dict[str, float]:
    """Seconds per test module (the path before '::') from `--durations` lines; other lines are
    comments or pytest's headers and are skipped."""
    seconds: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = DURATION_LINE.match(line)
        if match:
            seconds[match["nodeid"].split("::")[0]] += float(match["seconds"])
    return dict(seconds)


def worksteal_order(nodeids: list[str], module_seconds: dict[str, float], workers: int) -> list[int]:
    """Indices into `nodeids` in the order to run them (see the module docstring). With fewer than
    two workers, or when the slow modules cannot fit the runs, the order is left as collected."""
    if workers < 2:
        return list(range(len(nodeids)))
    modules: dict[str, list[int]] = {}
    for i, nodeid in enumerate(nodeids):
        modules.setdefault(nodeid.split("::")[0], []).append(i)
    slow = sorted((m for m in modules if module_seconds.get(m, 0) > 0), key=lambda m: -module_seconds[m])
    # Run lengths as worksteal cuts them: each idle worker in turn gets len(pending) // workers_left.
    lengths, left = [], len(nodeids)
    for w in range(workers):
        lengths.append(left // (workers - w))
        left -= lengths[-1]
    runs: list[list[int]] = [[] for _ in range(workers)]
    seconds = [0.0] * workers
    for module in slow:  # longest first, each to the run with the fewest seconds so far (LPT)
        w = min(range(workers), key=lambda r: seconds[r])
        runs[w] += modules[module]
        seconds[w] += module_seconds[module]
    if any(len(run) > length for run, length in zip(runs, lengths)):
        return list(range(len(nodeids)))
    fast = [i for module, idx in modules.items() if module not in module_seconds or module_seconds[module] <= 0
            for i in idx]
    for run, length in zip(runs, lengths):
        take = length - len(run)
        run += fast[:take]
        del fast[:take]
    return [i for run in runs for i in run]
