"""Fault injection for the fault suite (scripts/fault_suite.py) and the tests.

Faults are planned through one environment variable, so a run under test is the real command
with the real config: `SPEEDGPT_INJECT="KIND@STEP[:RANK],..."`, e.g. `nan@5` (the loss of step 5
becomes NaN on rank 0, so its gradients do too), `sigterm@3` (the process sends itself SIGTERM
during step 3), `save_error@4` (writing the checkpoint of step 4 fails with an OSError, as on a
full disk), `exit@6:1` (rank 1 dies with exit status 1 at the start of step 6, as a crashed
worker). Steps are 0-based optimizer steps (the step being computed); RANK defaults to 0. A
fault fires at most once per process, so a rollback or a restarted worker does not meet it again
unless the variable says so, and only in the first attempt of a torchrun group
(TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted worker runs clean. Faults never fire
inside `suspended()`: the compile warmup trains real steps of the schedule, and a fault planned
for step 6 belongs to the run's step 6, not to the warmup's. Unset (the normal case), every check
is one dictionary lookup.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

KINDS = ("nan", "sigterm", "save_error", "exit")
_fired: set[tuple[str, int, int]] = set()
_parsed: tuple[str, set[tuple[str, int, int]]] = ("", set())
_suspended = False


def _plan() -> set[tuple[str, int, int]]:
    global _parsed
    raw = os.environ.get("SPEEDGPT_INJECT", "")
    if raw != _parsed[0]:
        plan = set()
        for item in filter(None, (x.strip() for x in raw.split(","))):
            try:
                kind, where = item.split("@")
                step, _, rank = where.partition(":")
                entry = (kind, int(step), int(rank or 0))
            except ValueError:
                raise ValueError(f"SPEEDGPT_INJECT item {item!r} must look like KIND@STEP[:RANK], e.g. nan@5") from None
            if kind not in KINDS:
                raise ValueError(f"SPEEDGPT_INJECT kind {kind!r} must be one of {', '.join(KINDS)}")
            plan.add(entry)
        _parsed = (raw, plan)
    return _parsed[1]


def fires(kind: str, step: int, rank: int = 0) -> bool:
    """Whether the fault `kind` is planned for `step` on `rank` and has not fired yet (it fires now)."""
    plan = _plan()
    if not plan or _suspended or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        return False
    key = (kind, step, rank)
    if key in plan and key not in _fired:
        _fired.add(key)
        return True
    return False


@contextmanager
def suspended():
    """No fault fires inside the block (the compile warmup's steps)."""
    global _suspended
    before, _suspended = _suspended, True
    try:
        yield
    finally:
        _suspended = before


def reset() -> None:
    """Forget which faults fired (tests run several faulty runs in one process)."""
    _fired.clear()
