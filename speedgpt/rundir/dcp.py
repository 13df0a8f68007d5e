"""Distributed checkpoints with `torch.distributed.checkpoint` (DCP): every rank writes its own shards.

Layout: `checkpoints/step_NNNNNN/dcp/` (DCP's files: one per rank plus `.metadata`) and
`state.json` (step, tokens, loader position, RNG; written last by rank 0, it marks the checkpoint
complete, as in the full format of rundir/checkpoint.py). The whole checkpoint is written under a
hidden temporary name and renamed once every rank has finished, so readers never see half of one.

What is saved is one flat dict of tensors, keyed without ambiguity (parameter names contain dots):
  model/<parameter or buffer name>                  the model's state_dict (DTensor shards under fsdp)
  optim/<member>/<parameter name>/<state name>      the optimizers' per-parameter state
DCP stores each tensor with its global shape and reassembles any layout on load, so a checkpoint
written by FSDP on N ranks loads on M ranks, and into ddp (whole tensors), and back.

Checksums, as in the single-file format: once DCP has written every file, each rank hashes its
share of the checkpoint's files (the ones DCP's metadata names, plus `.metadata`; in the writer
thread for a background save) and writes its part of the manifest atomically; rank 0 merges the
parts into state.json's `files` (path, size, SHA-256), and loading verifies them, so a flipped or
truncated shard is a one-line error naming the file. Old checkpoints follow the retention policy
of the single-file format (`prune_checkpoints`: the newest `keep`, plus every `keep_every`-th).

`save(..., background=True)` stages the tensors to CPU memory, returns, and writes them in a
background thread (over a gloo group of its own, so its collectives never interleave with
training's); `Pending.finish()` (the next save, or the end of the run) waits and publishes.
`read_model_state` reads a checkpoint's weights in one process with no process group: that is how
`speedgpt export`, `sample` and `eval` consolidate one.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

DCP_DIR = "dcp"
MODEL, OPTIM = "model/", "optim/"
MANIFEST_PART = ".manifest-rank{rank}.json"  # one rank's share of the checksums, merged into state.json


def is_dcp_checkpoint(path: Path) -> bool:
    return (Path(path) / DCP_DIR).is_dir()


def flat_state(model: torch.nn.Module, optimizers) -> dict[str, Any]:
    """The training state as DCP saves it (see the module docstring). Collective under ddp with
    several ranks (the sharded optimizers gather their state), local under fsdp."""
    out: dict[str, Any] = {MODEL + k: v for k, v in model.state_dict().items()}
    for member, params in optimizers.state_dict(gather=False).items():
        for name, state in params.items():
            for key, value in state.items():
                out[f"{OPTIM}{member}/{name}/{key}"] = value
    return out


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier(group=None) -> None:
    if _distributed():
        dist.barrier(group=group)


_checkpoint_group = None


def _background_group():
    """A gloo group for the background writer's collectives (created once, by every rank)."""
    global _checkpoint_group
    if _checkpoint_group is None and _distributed():
        _checkpoint_group = dist.new_group(backend="gloo")
    return _checkpoint_group


@dataclass
class Pending:
    """A checkpoint being written; `finish()` (every rank) waits for it and publishes it."""
    future: Any  # done when this rank's files and its manifest part are written
    tmp: Path
    final: Path
    state: dict
    keep: int
    is_main: bool
    world_size: int = 1
    keep_every: int = 0

    def finish(self) -> Path:
        if self.future is not None:
            self.future.result()
            self.future = None
        _barrier()
        if self.is_main:
            from ..atomic import atomic_write, publish_dir
            from .checkpoint import prune_checkpoints

            files = merge_manifest(self.tmp, self.world_size)
            atomic_write(self.tmp / "state.json",
                         json.dumps({**self.state, "complete": True, "format": "dcp", "files": files}, indent=1))
            if self.final.exists():
                shutil.rmtree(self.final)
            publish_dir(self.tmp, self.final)
            prune_checkpoints(self.final.parent, self.keep, self.keep_every)
        _barrier()
        return self.final


def checkpoint_files(ckpt: Path) -> list[str]:
    """The files of a written DCP checkpoint, relative to `ckpt` (the step directory): the ones its
    metadata names, and the metadata itself. Sorted, so every rank lists them in the same order."""
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(Path(ckpt) / DCP_DIR)).read_metadata()
    names = {info.relative_path for info in (meta.storage_data or {}).values()}
    return sorted(f"{DCP_DIR}/{name}" for name in names | {".metadata"})


def write_manifest_part(ckpt: Path, rank: int, world_size: int) -> None:
    """Hash this rank's share of the checkpoint's files (every world_size-th, from `rank`) and write
    their sizes and SHA-256 atomically to its manifest part. Runs once every rank's files exist."""
    from ..atomic import atomic_write, sha256_file

    ckpt = Path(ckpt)
    part = {name: {"sha256": sha256_file(ckpt / name), "bytes": (ckpt / name).stat().st_size}
            for name in checkpoint_files(ckpt)[rank::world_size]}
    atomic_write(ckpt / MANIFEST_PART.format(rank=rank), json.dumps(part))


def merge_manifest(ckpt: Path, world_size: int) -> dict[str, dict]:
    """Every rank's manifest part, merged (and the parts removed): state.json's `files`."""
    files: dict[str, dict] = {}
    for rank in range(world_size):
        part = Path(ckpt) / MANIFEST_PART.format(rank=rank)
        files.update(json.loads(part.read_text()))
        part.unlink()
    missing = sorted(set(checkpoint_files(ckpt)) - set(files))
    if missing:
        raise RuntimeError(f"checkpoint {ckpt}: no checksum for {', '.join(missing[:3])} (a rank's manifest is incomplete)")
    return files


def verify(path: Path, fix: str = "") -> dict:
    """Check a DCP checkpoint's files against the sizes and SHA-256 in its state.json (a
    CheckpointError naming the first bad file and `fix`); return the state."""
    from .checkpoint import read_state, verify_files

    state = read_state(path, fix)
    verify_files(Path(path), state, names=None, fix=fix)
    return state


def verify_on_ranks(path: Path) -> dict:
    """`verify` with the hashing shared among the ranks (each checks every world_size-th file); the
    verdicts are gathered, so every rank raises the same error, and none enters DCP's load alone."""
    if not _distributed():
        return verify(path)
    from .checkpoint import CheckpointError, read_state, verify_files

    state = read_state(path)  # the same file for every rank: the same result
    rank, world = dist.get_rank(), dist.get_world_size()
    error = None
    try:
        verify_files(Path(path), state, names=tuple(sorted(state.get("files", {}))[rank::world]))
    except CheckpointError as e:
        error = str(e)
    errors: list = [None] * world
    dist.all_gather_object(errors, error, group=_background_group())  # gloo: host objects on any backend
    first = next((e for e in errors if e), None)
    if first:
        raise CheckpointError(first)
    return state


def save(ckpt_root: Path, step: int, state: dict[str, Any], run_state: dict, *, is_main: bool, keep: int = 2,
         keep_every: int = 0, background: bool = False) -> Pending:
    """Start writing `state` (from `flat_state`) as checkpoint `step` on every rank. Synchronous
    unless `background`; either way call `.finish()` on the result (every rank) to publish it.
    Retention: the newest `keep` checkpoints (0: all), plus every `keep_every`-th step."""
    import torch.distributed.checkpoint as dcp

    final = Path(ckpt_root) / f"step_{step:06d}"
    tmp = final.with_name(f".{final.name}.dcp.tmp")  # the same name on every rank: they share it
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    rank, world = (dist.get_rank(), dist.get_world_size()) if _distributed() else (0, 1)
    future = None
    if background:
        group = _background_group()
        response = dcp.async_save(state, checkpoint_id=str(tmp / DCP_DIR), process_group=group,
                                  no_dist=not _distributed())
        staged = getattr(response, "staging_completion", None)
        if staged is not None:
            staged.result()  # the tensors are copied: training may change them again
        future = _after(getattr(response, "upload_completion", response),
                        lambda: write_manifest_part(tmp, rank, world))
    else:
        dcp.save(state, checkpoint_id=str(tmp / DCP_DIR))
        write_manifest_part(tmp, rank, world)  # DCP's save ends in a collective: every file exists
    return Pending(future, tmp, final, {**run_state, "step": step}, keep, is_main, world, keep_every)


def _after(upload: Future, then) -> Future:
    """A future done when `upload` is and `then()` has run after it, in a thread of its own (the
    hashing of a background save stays off the training thread too)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speedgpt-dcp-manifest")
    future = pool.submit(lambda: (upload.result(), then())[1])
    pool.shutdown(wait=False)
    return future


def _metadata(path: Path):
    import torch.distributed.checkpoint as dcp

    return dcp.FileSystemReader(str(Path(path) / DCP_DIR)).read_metadata().state_dict_metadata


def model_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The whole shape of each model tensor a DCP checkpoint holds, from its metadata (nothing loaded)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return {k[len(MODEL):]: tuple(md.size) for k, md in _metadata(path).items()
            if k.startswith(MODEL) and isinstance(md, TensorStorageMetadata)}


def load_into(path: Path, model: torch.nn.Module, optimizers) -> dict:
    """Load checkpoint `path` into `model` and `optimizers` (any world size, any strategy: each
    tensor is read into this rank's layout), and return its state.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from ..parallel.dtensor import is_sharded

    path = Path(path)
    run_state = verify_on_ranks(path)  # a flipped or truncated shard: an error naming it, not wrong weights
    meta = _metadata(path)
    template: dict[str, Any] = {MODEL + k: v for k, v in model.state_dict().items()}
    missing = sorted(k for k in template if k not in meta)
    if missing:
        raise KeyError(f"checkpoint {path} lacks model tensors this model has: {', '.join(missing[:3])}")
    params = dict(model.named_parameters())
    for key, md in meta.items():
        if not key.startswith(OPTIM):
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise ValueError(f"checkpoint {path}: optimizer entry {key} is not a tensor")
        member, name, _ = key[len(OPTIM):].split("/", 2)
        p = params.get(name)
        if p is None:
            raise KeyError(f"optimizer state for parameters this model does not have: {name}")
        if is_sharded(p) and tuple(md.size) == tuple(p.shape):
            template[key] = torch.zeros_like(p, dtype=md.properties.dtype)  # read as this rank's shard
        else:
            device = p.to_local().device if is_sharded(p) else p.device
            template[key] = torch.zeros(md.size, dtype=md.properties.dtype, device=device)
    dcp.load(template, checkpoint_id=str(path / DCP_DIR))
    model.load_state_dict({k[len(MODEL):]: v for k, v in template.items() if k.startswith(MODEL)})
    nested: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for key, value in template.items():
        if key.startswith(OPTIM):
            member, name, skey = key[len(OPTIM):].split("/", 2)
            nested.setdefault(member, {}).setdefault(name, {})[skey] = value
    for member in optimizers.members():
        nested.setdefault(member, {})
    optimizers.load_state_dict(nested)
    return run_state


def read_model_state(path: Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """A DCP checkpoint's model weights, whole, in this one process (no process group needed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = _metadata(path)
    template = {k: torch.empty(md.size, dtype=md.properties.dtype, device=device)
                for k, md in meta.items() if k.startswith(MODEL) and isinstance(md, TensorStorageMetadata)}
    dcp.load(template, checkpoint_id=str(Path(path) / DCP_DIR), no_dist=True)
    return {k[len(MODEL):]: v for k, v in template.items()}
