"""Whether Triton is here and can run for a device: the one place the kernels (softcap_ce*.py,
relu2_fp8.py) learn it. CI and CPU-only installs have no Triton; each kernel has a torch fallback."""

from __future__ import annotations

import os

import torch

try:  # CI and CPU-only installs have no triton; the torch fallback below still works.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    triton = None
    tl = None
    HAVE_TRITON = False


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available(device: torch.device | str | None = None) -> bool:
    """Whether the Triton kernels can run for tensors on `device` (CUDA, or CPU under the interpreter)."""
    if not HAVE_TRITON:
        return False
    if device is None:
        return torch.cuda.is_available() or interpreting()
    device = torch.device(device)
    return device.type == "cuda" or (device.type == "cpu" and interpreting())
