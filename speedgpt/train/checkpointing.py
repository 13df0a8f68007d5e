"""The trainer's checkpoints: whether a run resumes, and writing and reading the model and
optimizer state in the run's checkpoint format (one full file set from rank 0, or DCP shards
from every rank, optionally written in the background).

The trainer's own progress (step counters, loader position, RNG) travels as the `state` dict the
caller hands to `save` and gets back from `load_latest`: this module does not know what is in it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from ..config import Config
from ..parallel.dist import DistInfo, barrier
from ..rundir import RunDir
from ..rundir.checkpoint import CheckpointSaveError, load_checkpoint, read_state
from ..rundir.weights import shapes_of, weights_mismatch
from .resume import model_mismatch


def should_resume(resume: bool | str, run_dir: Path) -> bool:
    """`resume` is True, False or "auto": resume when the run directory has a checkpoint. A worker
    that torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0) also resumes when one exists, so
    `torchrun --max-restarts=N ... --run-dir DIR` recovers from a dead worker without a human."""
    if resume is True:
        return True
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
    if resume == "auto" or restarted:
        return bool(RunDir(run_dir).list_checkpoints())
    return False


class Checkpointer:
    """Saves and loads the model and optimizers of one run, in train.checkpoint_format."""

    def __init__(self, rundir: RunDir, cfg: Config, dist: DistInfo, strategy: str, model, optimizers,
                 metrics):
        self.rundir, self.cfg, self.t, self.dist, self.strategy = rundir, cfg, cfg.train, dist, strategy
        self.model, self.optimizers, self.metrics = model, optimizers, metrics
        self.pending = None  # a DCP checkpoint being written in the background
        self.last_save_time = time.monotonic()  # train.checkpoint_every_min counts from here

    def save(self, step: int, state: dict, final: bool = False) -> Path | None:
        """Write a checkpoint (rank 0; every rank with train.checkpoint_format=dcp). A failed write keeps
        the previous checkpoints and is reported; training goes on, except for the final save (`final`),
        whose failure is an error."""
        if self.t.checkpoint_format != "full":
            return self.save_dcp(step, state)
        path, error = None, None
        optim_states = self.optimizers.state_dict()  # sharded: a collective, all ranks
        model_state = self.full_model_state()  # fsdp: a collective too
        if self.dist.is_main:
            try:
                path = self.rundir.save_checkpoint(step, model_state, optim_states, state,
                                                   keep=self.t.keep_checkpoints, keep_every=self.t.keep_checkpoint_every)
            except CheckpointSaveError as e:
                error = e
                print(f"warning: {e}" + ("" if final else "; training continues"), flush=True)
                self.metrics.log({"event": "checkpoint_failed", "step": step, "error": str(e)})
        self.last_save_time = time.monotonic()
        barrier()
        if error is not None and final:
            raise error
        return path

    def save_dcp(self, step: int, state: dict) -> Path | None:
        """Every rank writes its shards (rundir/dcp.py); with dcp_async in the background, published
        at the next save or at the end of the run."""
        from ..rundir import dcp

        self.finish()
        background = self.t.checkpoint_format == "dcp_async"
        self.pending = dcp.save(self.rundir.checkpoints, step, dcp.flat_state(self.model, self.optimizers), state,
                                is_main=self.dist.is_main, keep=self.t.keep_checkpoints,
                                keep_every=self.t.keep_checkpoint_every, background=background)
        self.last_save_time = time.monotonic()
        return None if background else self.finish()

    def finish(self) -> Path | None:
        """Wait for a checkpoint being written in the background and publish it (every rank)."""
        pending, self.pending = self.pending, None
        return pending.finish() if pending is not None else None

    def full_model_state(self) -> dict:
        """The model's weights, whole (the same checkpoint format for every strategy and world size).
        Under fsdp a collective: the shards are gathered, onto rank 0 only and into CPU memory."""
        if self.strategy != "fsdp":
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_model_state(self, state: dict) -> None:
        if self.strategy != "fsdp":
            self.model.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))

    def load_latest(self, device: torch.device) -> tuple[Path, dict]:
        """Load the newest checkpoint into the model and optimizers; returns its path and the state
        dict that was saved with it (with its "step")."""
        from ..rundir import dcp

        self.finish()  # a checkpoint still being written in the background (a rollback)
        path = self.rundir.latest_checkpoint()
        expected = shapes_of(self.model.state_dict())  # whole shapes, also of sharded (DTensor) parameters
        if dcp.is_dcp_checkpoint(path):  # written by any number of ranks, under any strategy
            self.check_fits(path, read_state(path), expected, dcp.model_shapes(path))
            state = dcp.load_into(path, self.model, self.optimizers)
        else:
            model_state, optim_states, state = load_checkpoint(path, map_location=device)
            self.check_fits(path, state, expected, shapes_of(model_state))
            self.load_model_state(model_state)
            self.optimizers.load_state_dict(optim_states)
        return path, state

    def check_fits(self, path: Path, state: dict, expected: dict, found: dict) -> None:
        """A CheckpointError naming what changed when the checkpoint's weights do not fit the model
        (the config was edited since), instead of torch's "Error(s) in loading state_dict"."""
        problem = weights_mismatch(expected, found)
        if problem:
            raise model_mismatch(path, state, self.cfg, problem)
