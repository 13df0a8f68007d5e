"""Device facts for MFU and the run's environment snapshot."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

# Dense bf16 tensor-core peaks from the vendors' datasheets (FLOP/s), matched by device-name
# substring, most specific first. `speedgpt bench --peak` measures the achievable peak instead.
BF16_PEAK_FLOPS = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A10G", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("4090", 165e12),
    ("3090", 71e12),
]


def peak_flops(device: torch.device, override: float = 0.0) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in BF16_PEAK_FLOPS:
        if key in name:
            return flops
    return None


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
