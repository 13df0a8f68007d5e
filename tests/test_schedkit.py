"""The order that makes `pytest -n N --dist worksteal` workers finish together (tests/schedkit.py)."""

from __future__ import annotations

from pathlib import Path

import schedkit

DURATIONS = """\
============================= slowest 40 durations =============================
74.17s call     tests/test_golden.py::test_dense
40.00s call     tests/test_golden.py::test_switches
60.00s call     tests/test_fault.py::test_kill[2]
10.59s setup    tests/test_stages.py::test_loop
50.00s call     tests/test_ab.py::test_end_to_end
"""


def test_durations_lines_sum_per_module_and_headers_are_skipped():
    assert schedkit.read_durations(DURATIONS) == {
        "tests/test_golden.py": 114.17, "tests/test_fault.py": 60.0, "tests/test_stages.py": 10.59,
        "tests/test_ab.py": 50.0}


def test_slow_modules_are_dealt_longest_first_to_the_start_of_equal_runs():
    seconds = schedkit.read_durations(DURATIONS)
    nodeids = ([f"tests/test_fast{m}.py::test_{i}" for m in range(6) for i in range(5)]
               + ["tests/test_golden.py::test_dense", "tests/test_golden.py::test_switches"]
               + [f"tests/test_stages.py::test_{i}" for i in range(3)]
               + ["tests/test_fault.py::test_kill[2]", "tests/test_fault.py::test_kill[3]"]
               + ["tests/test_ab.py::test_end_to_end"])
    order = schedkit.worksteal_order(nodeids, seconds, workers=2)
    assert sorted(order) == list(range(len(nodeids)))  # every test once
    ran = [nodeids[i] for i in order]
    first, second = ran[:len(ran) // 2], ran[len(ran) // 2:]  # the runs worksteal hands out
    module = lambda nodeid: nodeid.split("::")[0]  # noqa: E731
    # golden (114 s) to the first run; fault (60 s) then ab (50 s) to the second; stages (10.6 s) to the second
    # (110 s < 114 s); each run starts with its slow modules, whole and in collection order inside.
    assert first[:2] == ["tests/test_golden.py::test_dense", "tests/test_golden.py::test_switches"]
    assert second[:6] == ["tests/test_fault.py::test_kill[2]", "tests/test_fault.py::test_kill[3]",
                          "tests/test_ab.py::test_end_to_end"] + [f"tests/test_stages.py::test_{i}" for i in range(3)]
    # What a late steal takes (the end of a run) is fast.
    assert all(module(n) not in seconds for n in first[2:] + second[6:])


def test_one_worker_or_slow_modules_too_big_for_a_run_keep_the_collected_order():
    seconds = {"tests/test_a.py": 9.0, "tests/test_b.py": 8.0}
    nodeids = [f"tests/test_a.py::test_{i}" for i in range(5)] + ["tests/test_b.py::test_0", "tests/test_c.py::t"]
    assert schedkit.worksteal_order(nodeids, seconds, workers=1) == list(range(7))
    assert schedkit.worksteal_order(nodeids, seconds, workers=2) == list(range(7))  # test_a's 5 > a run of 3


def test_every_module_of_the_slow_list_exists():
    root = Path(schedkit.__file__).parent.parent
    missing = [m for m in schedkit.read_durations(schedkit.SLOW_TESTS.read_text()) if not (root / m).is_file()]
    assert missing == [], f"{missing} in {schedkit.SLOW_TESTS.name}: refresh it (its header says how)"
