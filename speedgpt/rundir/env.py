"""The environment snapshot a run directory keeps in env.json: code version, packages, hardware."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

import torch

from ..provenance import source_version
from . import RunDir


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def environment_snapshot(device: torch.device) -> dict:
    packages = {}
    for name in ("speedgpt", "torch", "numpy", "tiktoken", "triton"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    snap = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "argv": sys.argv,
        "cwd": os.getcwd(),  # what the command's relative paths (config.toml's data files, say) are relative to
        "packages": packages,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device_name(device),
        "git": source_version(),  # speedgpt's own commit (provenance.py), "unknown" when it has none
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        snap["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
                       "count": torch.cuda.device_count()}
    return snap


def record_resume(rundir: RunDir, snapshot: dict, step: int, changed: list[str] | tuple = ()) -> None:
    """env.json keeps the environment and command the run started with; each resume appends one
    entry to its "resumes" list: the step it resumed at, when, its command, the config values --extend let it
    change (`changed`, "key: checkpoint A, config B"), and whatever else in `snapshot` differs from the start
    (another machine, another speedgpt commit, ...)."""
    import time

    try:
        env = rundir.read_env()
    except ValueError:  # unreadable: the start's record is gone either way; keep the resumes from now on
        env = {"note": "env.json was unreadable when a resume rewrote it"}
    entry = {"step": step, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": snapshot.get("argv")}
    if changed:
        entry["changed"] = list(changed)
    entry.update({k: v for k, v in snapshot.items() if k not in entry and env.get(k) != v})
    env.setdefault("resumes", []).append(entry)
    rundir.write_env(env)


def started_in(run_dir) -> str | None:
    """The directory the run in `run_dir` was started from (env.json's "cwd"); None where it is not recorded (runs
    started before it was) or env.json is unreadable."""
    try:
        env = RunDir(run_dir).read_env()
    except (OSError, ValueError):
        return None
    cwd = env.get("cwd") if isinstance(env, dict) else None
    return cwd if isinstance(cwd, str) else None


def with_start_dir(message: str, run_dir, paths) -> str:
    """`message` (a path of the run's config not found) with, where it names one of `paths` that is relative, the
    directory that path is relative to: config.toml keeps paths as typed (its digest is of them)."""
    relative = [p for p in paths if p and not os.path.isabs(p) and p in message]
    if not relative:
        return message
    start = started_in(run_dir)
    where = f"the directory the run was started from, {start}" if start else \
        "the directory the run was started from (its env.json does not record which)"
    return f"{message} ({relative[0]} is relative to {where}: run from there, or give the path as an absolute one)"
