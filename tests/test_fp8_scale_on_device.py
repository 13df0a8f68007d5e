"""The FP8 ops' scalar scales are filled on the device, never copied from the host: on a GPU,
torch.tensor(v, device=cuda) copies from pageable memory, which synchronizes the host with the GPU. The
fused FP8 head + loss made 4 such tensors a micro-step, so the host could never run ahead of the GPU
(found in a 2-GPU profile of speedrun-latest, 2026-11-28: 8 cudaStreamSynchronize a step, all in
speedgpt::fp8_head_ce_fwd / _bwd). The dispatcher sees a fill as aten.full; a tensor made from host
data does not pass through it at all."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from speedgpt.model import fp8_head


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_fp8_scales_are_filled_on_the_device():
    with _Ops() as seen:
        s = fp8_head._scale(0.375, torch.device("meta"))
    assert seen.ops == ["aten.full.default"]
    assert s.shape == () and s.dtype == torch.float32 and s.device.type == "meta"
    assert fp8_head._scale(0.375, torch.device("cpu")).item() == 0.375
