"""Run a function on N local CPU processes with torchrun's environment (gloo), for the distributed tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_worker(rank: int, world_size: int, port: int, fn, args) -> None:
    # The variables torchrun would set: init_distributed (and so the Trainer) reads them.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # N processes on a few cores: oversubscribed threads only slow things down
    fn(rank, world_size, *args)


def spawn_local(fn, world_size: int, *args) -> None:
    """Run fn(rank, world_size, *args) in world_size fresh processes with torchrun's environment
    (for CPU tests on gloo and quick experiments). A failure in any rank raises here."""
    import torch.multiprocessing as mp

    mp.spawn(_local_worker, args=(world_size, free_port(), fn, args), nprocs=world_size, join=True)


def drop_checkpoints_after(run_dir: Path, step: int) -> None:
    """Delete run_dir's checkpoints later than `step`, as if the run had died after step's checkpoint."""
    from speedgpt.rundir.checkpoint import list_checkpoints

    for ckpt in list_checkpoints(Path(run_dir) / "checkpoints"):
        if int(ckpt.name.split("_")[-1]) > step:
            shutil.rmtree(ckpt)


def copy_without_checkpoint(run_dir: Path, dest: Path, step: int) -> Path:
    """A copy of run_dir without its checkpoint of `step` (and without metrics), to resume from the one before."""
    shutil.copytree(run_dir, dest)
    shutil.rmtree(dest / "checkpoints" / f"step_{step:06d}")
    (dest / "metrics.jsonl").unlink(missing_ok=True)
    return dest
