"""Process-group setup from torchrun's environment, and rank helpers.

Single-process runs need no launcher: without torchrun's variables this is world size 1 and no
process group is created. Under `torchrun` (one node or many, via its rendezvous) RANK,
WORLD_SIZE and LOCAL_RANK come from the environment; the backend is NCCL on CUDA and gloo on
CPU. NCCL's own environment (NCCL_NVLS_ENABLE, NCCL_IB_*, ...) is left exactly as the user set it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Whether init_distributed created the default process group: teardown only destroys a group
# it owns, so a caller (a test, a notebook) that set one up itself keeps it.
_owns_group = False


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(f"environment variable {name}={raw!r} is not an integer; launch with torchrun "
                           f"or unset it") from None


def _restart_store(world_size: int):
    """A store for a group torchrun restarted, or None (torch's default).

    Under `torchrun --max-restarts`, workers share the agent's TCP store across attempts, and the
    keys the previous attempt's ranks published (their gloo addresses) are still there: a restarted
    rank may read a dead peer's address and fail to connect (seen about one restart in three on
    CPU). Keys under a per-attempt prefix cannot be stale."""
    from datetime import timedelta

    attempt = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], _env_int("MASTER_PORT", 0), world_size, is_master=False,
                          timeout=timedelta(minutes=10))
    return dist.PrefixStore(f"speedgpt/attempt_{attempt}", store)


def init_distributed(requested_device: str = "auto") -> DistInfo:
    """Join the process group torchrun describes (no-op for a single process)."""
    global _owns_group
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world_size:
        raise RuntimeError(f"RANK={rank} is outside [0, WORLD_SIZE={world_size}); launch with torchrun")
    from ..device import resolve_device

    device = resolve_device(requested_device, local_rank, option="--train.device")
    if device.type == "cuda":
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local_rank} needs cuda:{device.index} but only "
                               f"{torch.cuda.device_count()} GPU(s) are visible; lower --nproc_per_node")
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        # device_id binds the NCCL communicator to this GPU eagerly (no lazy init inside the step).
        store = _restart_store(world_size)
        kw = dict(store=store, rank=rank, world_size=world_size) if store is not None else {}
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None, **kw)
        _owns_group = True
    if world_size > 1 and dist.get_world_size() != world_size:
        raise RuntimeError(f"WORLD_SIZE={world_size} but the process group has {dist.get_world_size()} ranks")
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def ensure_process_group(device: torch.device) -> None:
    """A one-process group where there is none (FSDP needs a group also on one rank); owned, so
    teardown destroys it."""
    global _owns_group
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device if device.type == "cuda" else None)
    _owns_group = True


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def from_rank0(value):
    """Rank 0's `value` on every rank; `value` itself without a group of several ranks. A collective: every rank
    calls it. For choices a rank could make differently from rank 0 (a name from its own clock, a temp folder)."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def teardown() -> None:
    """Destroy the process group init_distributed created (others are the caller's to destroy)."""
    global _owns_group
    if _owns_group and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _owns_group = False


# torch 2.13 renamed the tensor collectives; the GPU machines may run an older torch.
def reduce_scatter(output: torch.Tensor, input: torch.Tensor, async_op: bool = True):
    """Sum `input` (world_size * output.numel() elements) over ranks; rank r keeps chunk r in `output`."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=dist.ReduceOp.SUM, async_op=async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, async_op: bool = True):
    """Concatenate every rank's `input` into `output` (world_size * input.numel() elements)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, async_op=async_op)


def grad_comm_dtype(name: str) -> torch.dtype | None:
    """parallel.grad_comm_dtype (validated: "param" | "bf16") as the dtype gradients are reduced in;
    None: each gradient travels in its parameter's dtype."""
    return {"param": None, "bf16": torch.bfloat16}[name]


def mean_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """The mean of `t` over all ranks (a copy; `t` itself on one rank). A collective: every rank
    calls it. Used for reported losses, which are otherwise only rank 0's share of the batch."""
    if not is_distributed():
        return t
    t = t.detach().clone()
    dist.all_reduce(t)  # SUM then divide: gloo has no AVG
    return t / dist.get_world_size()
