"""Fully sharded data parallelism on PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`).

`build_fsdp_model` builds the model on the meta device (no memory; activation checkpointing is the
runtime's flag, applied per block in GPT.forward), shards every transformer block, each embedding,
then the root (head and scalars), allocates only this rank's shards (`to_empty`) and initializes
them parameter by parameter from the model's `init_plan`: each parameter is drawn whole, in the
unsharded model's order and from its seed, and this rank keeps its shard. So the initial weights
are the same for any world size, and no more than one parameter is ever whole on a device. With
train.compile the trainer then compiles it block by block (train/compile.py compile_blocks), so
each block's reduce-scatter starts inside the backward.

Mixed precision: on GPUs the gathered parameters are bf16 and gradients are reduced in fp32 (the
masters stay fp32); on CPUs everything is fp32 (gloo, the tests). parallel.grad_comm_dtype=bf16 sets
the policy's reduce_dtype to bf16 on either (FSDP casts the reduced shard back to fp32 itself).

`FSDPSync` is the trainer's gradient-sync handle for this strategy: only the last micro-step's
backward reduce-scatters (`set_requires_gradient_sync`), so accumulation costs no communication.
"""

from __future__ import annotations

import torch

from ..config import Config
from ..model.gpt import GPT
from ..model.runtime import max_seq_len, resolve_runtime
from .dist import grad_comm_dtype


def device_mesh(device: torch.device, world_size: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world_size,))


def mixed_precision(dtype: torch.dtype, reduce_dtype: torch.dtype | None = None):
    """FSDP2's policy for compute dtype `dtype`; `reduce_dtype` (parallel.grad_comm_dtype; None: fp32)
    is the dtype gradients are reduce-scattered in. The forward's inputs are left as the model makes them
    (cast_forward_inputs off): it casts its activations to the compute dtype itself, and what it keeps in float32
    on purpose, the rotary tables and YaRN's query scale each block receives, FSDP2 would round to bf16 in every
    block, where the same run under DDP keeps them in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype == torch.float32:  # fp32 unless bf16 comm (CPU runs and tests)
        return MixedPrecisionPolicy(reduce_dtype=reduce_dtype, cast_forward_inputs=False)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype or torch.float32,
                                cast_forward_inputs=False)


def build_fsdp_model(cfg: Config, device: torch.device, world_size: int) -> GPT:
    """The run's model, sharded over `world_size` ranks (a process group must exist)."""
    from torch.distributed.fsdp import fully_shard

    runtime = resolve_runtime(cfg, device, world_size=world_size)
    with torch.device("meta"):
        model = GPT(cfg.model, max_seq_len(cfg), runtime)
    if cfg.model.bf16_embeds:
        for emb in model.embeddings():
            emb.to(torch.bfloat16)
    mesh = device_mesh(device, world_size)
    kw = dict(mesh=mesh, mp_policy=mixed_precision(runtime.dtype, grad_comm_dtype(cfg.parallel.grad_comm_dtype)))
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=cfg.parallel.reshard_after_forward, **kw)
    for emb in model.embeddings():
        fully_shard(emb, reshard_after_forward=cfg.parallel.reshard_after_forward, **kw)
    # The root keeps the head (the FP8 head reads its weight directly, outside a module call) and the
    # per-layer scalars; it stays gathered through the forward (FSDP2 does not reshard the root).
    fully_shard(model, **kw)
    model.to_empty(device=device)
    init_sharded(model, seed=cfg.train.seed)
    return model


@torch.no_grad()
def init_sharded(model: GPT, seed: int) -> None:
    """Initialize a sharded model exactly as `build_model` initializes an unsharded one."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    device = model.rotary.cos.device
    params = dict(model.named_parameters())
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for name, fill in model.init_plan():
            p = params[name]
            if not isinstance(p, DTensor):
                fill(p)
                continue
            full = torch.empty(p.shape, dtype=p.dtype, device=device)
            fill(full)
            # src_data_rank=None: every rank holds the same full tensor, so each just keeps its chunk
            mine = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
            p.to_local().copy_(mine.to_local())
            del full
    model.init_buffers()


class FSDPSync:
    """The trainer's gradient-sync handle under FSDP: the same interface as parallel/ddp.py's GradSync."""

    timing = False

    def __init__(self, model: torch.nn.Module, world_size: int, device: torch.device):
        self.model = model
        self.world_size = world_size
        self.device = device

    def prepare(self, final: bool) -> None:
        # Non-final micro-steps accumulate unsharded gradients locally; the final one reduce-scatters.
        self.model.set_requires_gradient_sync(bool(final))

    def comm_wait_ms(self) -> float | None:
        return None

    def take_timers(self) -> list:
        return []
