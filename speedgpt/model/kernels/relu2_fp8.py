"""The FP8 MLP's activation in one pass each way: ReLU² with the row-wise e4m3 cast of its result.

Forward, per row of the fc output h (bf16):  a = relu(h)² (bf16),  a8 = a / s (e4m3),
s = max|a| / 448: what model/fp8_cast.py's quantize does to a, with a kept in bf16 for the
weight gradient of the projection.
Backward, per row:  dh = g · 2 relu(h) (computed in fp32, rounded once to bf16) and its e4m3 copy
with its own row scale, for the fc's input gradient.

Inductor already fuses each direction into one kernel, but a row of the speedrun's MLP (3072
values) is above its limit for keeping a reduction's row in registers (1024), so it reads the row
twice: once for the max, once to cast. Here a program holds whole rows in registers: h (and g)
are read once (H100 profile: the forward 318 us and the backward 427 us per layer and micro-step
at 49152 x 3072, against 252 and 352 us for their traffic at 3 TB/s).

`relu2_fp8_fwd` / `relu2_fp8_bwd` are custom ops (fake kernels for torch.compile); without Triton
on the tensors' device they run the same math in torch ops.
"""

from __future__ import annotations

import torch

from ..fp8_cast import quantize
from .triton_support import HAVE_TRITON, available, tl, triton

ROWS_PER_PROGRAM = 2
WARPS = 8

if HAVE_TRITON:
    @triton.jit
    def _row_tile(n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        """This program's ROWS whole rows: (row indices, row mask, column mask, offsets, element mask)."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        cols = tl.arange(0, BLOCK)
        col_ok = (cols < n_cols)[None, :]
        offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
        return rows, row_ok, col_ok, offs, row_ok[:, None] & col_ok

    @triton.jit
    def _row_cast(v, row_ok, col_ok, out8_ptr, scale_ptr, rows, offs):
        """Store v (fp32, already rounded to bf16) as e4m3 over its row maximum, and the scales; as
        fp8_cast.quantize does (an all-zero row, common after ReLU, gets the floor scale 1e-30 / 448)."""
        amax = tl.max(tl.where(col_ok, tl.abs(v), 0.0), axis=1)
        scale = tl.maximum(amax, 1e-30) / 448.0
        q = tl.clamp(v / scale[:, None], -448.0, 448.0)
        tl.store(out8_ptr + offs, q.to(tl.float8e4nv), mask=row_ok[:, None] & col_ok)
        tl.store(scale_ptr + rows, scale, mask=row_ok)

    @triton.jit
    def _relu2_fp8_fwd_kernel(h_ptr, a_ptr, a8_ptr, scale_ptr, n_rows, n_cols,
                              ROWS: tl.constexpr, BLOCK: tl.constexpr):
        rows, row_ok, col_ok, offs, mask = _row_tile(n_rows, n_cols, ROWS, BLOCK)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.maximum(h, 0.0)
        a = (r * r).to(tl.bfloat16, fp_downcast_rounding="rtne")
        tl.store(a_ptr + offs, a, mask=mask)
        _row_cast(a.to(tl.float32), row_ok, col_ok, a8_ptr, scale_ptr, rows, offs)

    @triton.jit
    def _relu2_fp8_bwd_kernel(g_ptr, h_ptr, dh_ptr, dh8_ptr, scale_ptr, n_rows, n_cols,
                              ROWS: tl.constexpr, BLOCK: tl.constexpr):
        rows, row_ok, col_ok, offs, mask = _row_tile(n_rows, n_cols, ROWS, BLOCK)
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dh = (g * 2.0 * tl.maximum(h, 0.0)).to(tl.bfloat16, fp_downcast_rounding="rtne")
        tl.store(dh_ptr + offs, dh, mask=mask)
        _row_cast(dh.to(tl.float32), row_ok, col_ok, dh8_ptr, scale_ptr, rows, offs)


def relu2_fp8_fwd_reference(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.relu(h.float()).square().to(h.dtype)
    return a, *quantize(a, torch.float8_e4m3fn, rowwise=True)


def relu2_fp8_bwd_reference(g: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dh = (g.float() * 2.0 * torch.relu(h.float())).to(h.dtype)
    return dh, *quantize(dh, torch.float8_e4m3fn, rowwise=True)


def _fake_outputs(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(h), torch.empty_like(h, dtype=torch.float8_e4m3fn), h.new_empty(h.shape[0], 1,
                                                                                             dtype=torch.float32)


def _launch(kernel, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_rows, n_cols = inputs[0].shape
    out = torch.empty_like(inputs[0], dtype=torch.bfloat16)
    out8 = torch.empty_like(inputs[0], dtype=torch.float8_e4m3fn)
    scale = torch.empty(n_rows, 1, dtype=torch.float32, device=inputs[0].device)
    grid = (triton.cdiv(n_rows, ROWS_PER_PROGRAM),)
    kernel[grid](*inputs, out, out8, scale, n_rows, n_cols, ROWS=ROWS_PER_PROGRAM,
                 BLOCK=triton.next_power_of_2(n_cols), num_warps=WARPS)
    return out, out8, scale


def _use_triton(t: torch.Tensor) -> bool:
    return t.dtype == torch.bfloat16 and available(t.device)


@torch.library.custom_op("speedgpt::relu2_fp8_fwd", mutates_args=())
def relu2_fp8_fwd(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(relu(h)² in h's dtype, its e4m3 copy over row scales, the (rows, 1) fp32 scales); h 2-D."""
    h = h.contiguous()
    if _use_triton(h):
        return _launch(_relu2_fp8_fwd_kernel, (h,))
    return relu2_fp8_fwd_reference(h)


relu2_fp8_fwd.register_fake(_fake_outputs)


@torch.library.custom_op("speedgpt::relu2_fp8_bwd", mutates_args=())
def relu2_fp8_bwd(g: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dh = g · 2 relu(h) in h's dtype, its e4m3 copy over row scales, the (rows, 1) fp32 scales)."""
    g, h = g.contiguous(), h.contiguous()
    if _use_triton(h) and g.dtype == h.dtype:
        return _launch(_relu2_fp8_bwd_kernel, (g, h))
    return relu2_fp8_bwd_reference(g, h)


relu2_fp8_bwd.register_fake(lambda g, h: _fake_outputs(h))
