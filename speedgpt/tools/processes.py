"""Running `python -m speedgpt` as a user would, from a tool that checks it (the fault suite, the
DCP reshard check): the command, its environment, and the line of its output that says why it failed."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path


def run_env() -> dict[str, str]:
    """The environment of a run started here: this checkout's speedgpt, one CPU thread per process
    (several share the cores), no planned fault and no torchrun restart count inherited."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "SPEEDGPT_INJECT": ""}
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    return env


def speedgpt_command(args: list[str], nproc: int = 0, max_restarts: int = 0) -> list[str]:
    """`python -m speedgpt ARGS`, under `torchrun --standalone` with `nproc` processes when nproc > 0."""
    if not nproc:
        return [sys.executable, "-m", "speedgpt", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            f"--max-restarts={max_restarts}", "-m", "speedgpt", *args]


def last_line(out: str) -> str:
    """The line of a run's output that says why it failed: speedgpt's own last one-line message
    ("speedgpt train: ..."; torchrun prints its own report after it), else the last line."""
    lines = [line for line in out.strip().splitlines() if line.strip()]
    ours = [line for line in lines if re.match(r"speedgpt \w+: ", line)]
    return (ours or lines or ["(no output)"])[-1]

