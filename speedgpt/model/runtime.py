"""How a model runs on a device, decided once: `ModelRuntime`, resolved from config + device.

The config says what is wanted (`model.fp8_head`, `model.attn_backend="auto"`, `train.dtype="auto"`);
the device says what is possible. `resolve_runtime` combines the two into one frozen description
that the model receives at construction (model/build.py) and never changes afterwards: the compute
dtype, the attention backend, the FP8 and fused-loss choices, the default attention windows and the
FP8 head's gradient scale. Training, evaluation, sampling, export and bench all build their model
from it, so one config gives one model everywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import Config, ModelConfig
from ..device import resolve_device, resolve_dtype
from .fp8_cast import E4M3_MAX


def fp8_supported(device: torch.device) -> bool:
    """torch._scaled_mm's FP8 matmuls: CUDA devices of compute capability 8.9 (Ada) and newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9) \
        and hasattr(torch, "float8_e4m3fn")


def cpu_runs_rowwise_fp8() -> bool:
    """Whether this torch's CPU runs torch._scaled_mm with row-wise scales (2.13 on; 2.11 asserts per-tensor only):
    what lets the tests and the CPU benchmarks take the FP8 paths a GPU takes (fp8_supported stays CUDA's)."""
    if not hasattr(torch, "float8_e4m3fn"):
        return False
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


def fused_ce_supported(device: torch.device) -> bool:
    from .kernels.softcap_ce import available

    return device.type == "cuda" and available(device)


def flex_available(device: torch.device) -> bool:
    """FlexAttention needs a compiled kernel; only CUDA devices of compute capability >= 8 get one here."""
    if device.type != "cuda":
        return False
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def choose_backend(requested: str, device: torch.device) -> str:
    # An explicit choice is kept: flex on a CPU runs as the unfused reference (for tests, not speed).
    if requested == "auto":
        return "flex" if flex_available(device) else "sdpa"
    return requested


@dataclass(frozen=True)
class ModelRuntime:
    """Everything about running a model that is not a weight. Frozen: a model built with one keeps it."""
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32  # compute dtype; parameters stay fp32 masters
    attn_backend: str = "sdpa"  # "sdpa" | "flex" (already resolved from "auto")
    window_block: int = 128  # windows are whole blocks of this many tokens (flex's block size)
    windows: tuple[int, int] | None = None  # (long, short) when forward is given none; None: no window
    fp8_head: bool = False  # lm_head matmuls in FP8 (model/fp8_head.py)
    fp8_w_bound: float = 24.0  # the FP8 head's weight scale is fp8_w_bound / 448 (model.fp8_head_w_bound)
    fused_ce: bool = False  # softcapped loss in Triton (model/kernels/softcap_ce.py)
    fp8_mlp: str = ""  # "" or the scaling of the MLP's FP8 matmuls (rowwise | tensorwise)
    fp8_mlp_fused_act: bool = False  # rowwise fp8_mlp: ReLU² and its casts in one kernel each way
    fp8_attn: str = ""  # "" or the scaling of the attention projections' FP8 matmuls
    # The FP8 head's unfused backward scales the logit gradient by this (model/fp8_head.py): the loss
    # is a mean over a rank's tokens per step, which bounds that gradient.
    fp8_grad_scale: float = 1.0 / E4M3_MAX
    # Training forwards recompute each block's activations in the backward instead of keeping them.
    activation_checkpointing: bool = False
    # MoE layers dispatch tokens with torch._grouped_mm (one kernel per projection) instead of a loop
    # over experts: on CUDA.
    moe_grouped: bool = False
    # YaRN (model.yarn): (rotary frequencies, attention-scale multiplier) when forward is given none,
    # those of the step the windows are; None: the rotary tables and the layers' own scale
    yarn: tuple[tuple[float, ...], float] | None = None

    def replace(self, **changes) -> ModelRuntime:
        return dataclasses.replace(self, **changes)


def runtime_for(model_cfg: ModelConfig, device: str | torch.device, *, dtype: str | torch.dtype = "auto",
                window_block: int = 128, windows: tuple[int, int] | None = None,
                grad_tokens: float | None = None) -> ModelRuntime:
    """The runtime of `model_cfg` on `device`: each FP8 / fused choice is on where asked for and the
    device runs it; `grad_tokens` is the number of tokens a rank's loss averages over per step."""
    device = resolve_device(device)
    fp8 = fp8_supported(device)
    if not isinstance(dtype, torch.dtype):
        dtype = resolve_dtype(dtype, device)
    return ModelRuntime(
        device=device, dtype=dtype, attn_backend=choose_backend(model_cfg.attn_backend, device),
        window_block=window_block, windows=windows,
        fp8_head=model_cfg.fp8_head and fp8, fp8_w_bound=model_cfg.fp8_head_w_bound,
        fused_ce=model_cfg.fused_ce and fused_ce_supported(device),
        fp8_mlp=model_cfg.fp8_scaling if model_cfg.fp8_mlp and fp8 else "",
        fp8_mlp_fused_act=model_cfg.fp8_mlp_fused_act,
        fp8_attn=model_cfg.fp8_scaling if model_cfg.fp8_attn and fp8 else "",
        fp8_grad_scale=1.0 / (grad_tokens * E4M3_MAX) if grad_tokens else 1.0 / E4M3_MAX,
        moe_grouped=device.type == "cuda",
    )


def resolve_runtime(cfg: Config, device: str | torch.device, *, world_size: int = 1,
                    step: int | None = None) -> ModelRuntime:
    """The runtime a run's config gives on `device`: its dtype rule, its schedule's window block and
    the windows of training step `step` (default: the last, whose windows the finished model was
    trained with) as forward's default, and the FP8 head's gradient scale for a rank's share of the
    step's tokens."""
    from ..plan import RunPlan

    plan = RunPlan.of(cfg, world_size)
    step = plan.steps if step is None else min(step, plan.steps)
    # The smallest step of a stage table has the largest logit gradients: the FP8 head's scale fits it.
    rt = runtime_for(cfg.model, device, dtype=cfg.train.dtype, window_block=cfg.schedule.window_block,
                     windows=plan.windows_at(step), grad_tokens=plan.min_batch_tokens() / world_size)
    if plan.yarn is not None:
        freq, scale = plan.yarn.state(step)
        rt = rt.replace(yarn=(tuple(freq.tolist()), scale))
    return rt.replace(activation_checkpointing=cfg.parallel.activation_checkpointing)


def max_seq_len(cfg: Config) -> int:
    """The longest sequence a run's model sees (rotary tables are built for it)."""
    from ..stages import stage_plan

    return max(cfg.data.seq_len, cfg.data.val_seq_len or 0, stage_plan(cfg).max_seq_len())
