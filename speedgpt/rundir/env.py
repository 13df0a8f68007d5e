"""The environment snapshot a run directory keeps in env.json: code version, packages, hardware."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def git_state(path: Path) -> dict:
    """Commit and dirtiness of the source tree the package runs from, when it is a git checkout."""
    def run(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        commit = run("rev-parse", "HEAD")
        if not commit:
            return {}
        return {"commit": commit, "dirty": bool(run("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {}


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
        "packages": packages,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device_name(device),
        "git": git_state(Path(__file__).resolve().parents[2]),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        snap["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
                       "count": torch.cuda.device_count()}
    return snap
