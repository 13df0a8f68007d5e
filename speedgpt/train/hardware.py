"""Device peak FLOP/s, for MFU."""

from __future__ import annotations

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
