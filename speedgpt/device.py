"""Which device and compute dtype a run uses, decided in one place for training, eval, sampling and bench."""

from __future__ import annotations

import torch


class DeviceError(ValueError):
    """A requested device does not exist here; the message names the fix."""


def resolve_device(requested: str | torch.device = "auto", local_rank: int = 0, *,
                   option: str = "--device") -> torch.device:
    """The torch device for a `train.device` / `--device` value: "auto" is this rank's GPU if CUDA is
    visible, else the CPU; "cuda" without an index is this rank's GPU. `option` names the setting
    in the error when the device does not exist here."""
    if isinstance(requested, torch.device):
        return requested
    if requested == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise DeviceError(f"{option}={requested} is not a torch device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = " (this PyTorch is a CPU-only build)" if torch.version.cuda is None else ""
            raise DeviceError(f"{option}={requested} but this machine has no usable CUDA device{build}; "
                              f"use {option}=auto or cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"{option}={requested} but MPS is not available here; use {option}=auto or cpu")
    return device


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """The compute dtype for `train.dtype`: "auto" is bf16 on CUDA and fp32 elsewhere."""
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, requested)
