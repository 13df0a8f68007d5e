"""The float-order table of tests/test_golden_losses.py: how far each golden run's losses move, as the largest
relative difference of any loss from the same run on one thread here, under another float order of the same
math (MKL's and torch's lower kernel levels, two threads) and under a real change (Muon's lr 1% off), in
float32 and in float64. REL_TOL must sit above the first kind and below the second, with room on both sides.

    python scripts/golden_tolerance.py [dense switches]

Each variant runs in a fresh process: MKL and torch read their kernel level when they load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # speedgpt from this checkout; the golden runs' module

import test_golden_losses as golden  # noqa: E402

# (row, environment, threads, extra overrides); the first is the reference the others are measured from.
VARIANTS = [
    ("one thread (the reference)", {}, 1, False),
    ("MKL's SSE4.2 code (MKL_ENABLE_INSTRUCTIONS=SSE4_2)", {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, 1, False),
    ("torch's scalar kernels (ATEN_CPU_CAPABILITY=default)", {"ATEN_CPU_CAPABILITY": "default"}, 1, False),
    ("2 threads instead of 1", {}, 2, False),
    ("Muon lr 1% off (a real change)", {}, 1, True),
]


def child(name: str, float64: bool, threads: int, lr_off: bool) -> None:
    """Print run `name`'s losses as JSON (this process's kernel level is the environment's)."""
    from speedgpt.config import load_preset

    extra = (f"--optim.muon_lr={load_preset('tiny-cpu').optim.muon_lr * 1.01!r}",) if lr_off else ()
    with tempfile.TemporaryDirectory() as tmp:
        shards = golden.synthetic_shards(Path(tmp) / "data")
        print(json.dumps(golden.run_losses(name, shards, Path(tmp) / "run", float64=float64, threads=threads,
                                           extra=extra)))


def losses(name: str, float64: bool, env: dict, threads: int, lr_off: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", name, str(int(float64)), str(threads), str(int(lr_off))]
    out = subprocess.run(cmd, env={**os.environ, **env}, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in golden.RUNS]
    if unknown:
        print(f"unknown run {unknown[0]!r}: pick from {', '.join(golden.RUNS)}", file=sys.stderr)
        return 2
    for name in names:
        print(f"{name}: largest relative difference from the one-thread run (REL_TOL = {golden.REL_TOL:g})")
        print(f"| {'change':<54} | float32 | float64 |")
        reference = {f64: losses(name, f64, {}, 1, False) for f64 in (False, True)}
        for row, env, threads, lr_off in VARIANTS[1:]:
            diffs = [golden.relative_difference(losses(name, f64, env, threads, lr_off), reference[f64])
                     for f64 in (False, True)]
            print(f"| {row:<54} | {diffs[0]:.1e} | {diffs[1]:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        name, float64, threads, lr_off = sys.argv[2:6]
        child(name, bool(int(float64)), int(threads), bool(int(lr_off)))
    else:
        sys.exit(main(sys.argv[1:] or list(golden.RUNS)))
