"""Atomic, checksummed checkpoints and exact resume.

A checkpoint is a directory `step_NNNNNN/` with `model.pt`, `optim.pt` and `state.json`. It is
written under a temporary name (`.tmp-...`), every file fsynced, then renamed into place
(speedgpt/atomic.py), so a crash at any moment leaves either the whole checkpoint or a temporary
directory that is never picked (and is cleared by the next save). `state.json` is written last and
records the SHA-256 and size of the other files; loading verifies them, so a flipped or truncated
file is an error naming that file, never a silent resume with wrong weights. Tensors load with
`weights_only=True`: a checkpoint from elsewhere cannot run code; everything else (loader
position, RNG state, counters) is plain JSON in state.json.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from .. import faults
from ..atomic import atomic_write, publish_dir, sha256_file

STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-"
TENSOR_FILES = ("model.pt", "optim.pt")


class CheckpointError(RuntimeError):
    """A checkpoint is missing or unreadable; the message says which and what to do."""


class CheckpointSaveError(CheckpointError):
    """Writing a checkpoint failed; the previous checkpoints are untouched (the message names the newest)."""


def _step_of(path: Path) -> int:
    return int(path.name[len(STEP_PREFIX):])


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first. Temporary (half-written) directories are ignored."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir()
             if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.name[len(STEP_PREFIX):].isdigit()]
    return sorted(found, key=_step_of)  # numeric: step 1000000 > 999999


def latest_checkpoint(ckpt_root: Path) -> Path:
    found = list_checkpoints(ckpt_root)
    if not found:
        raise CheckpointError(f"no checkpoint in {ckpt_root}; nothing to resume: start the run again in a fresh "
                              f"--run-dir (`speedgpt train` can also replace this one: --overwrite)")
    return found[-1]


def checkpoints_to_delete(steps: list[int], keep_last: int, keep_every: int) -> list[int]:
    """Steps a retention policy removes: all but the newest `keep_last` (0: keep all), except
    multiples of `keep_every` (0: none), which are kept for good (e.g. for later evaluation)."""
    if keep_last <= 0:
        return []
    old = sorted(steps)[:-keep_last]
    return [s for s in old if not (keep_every > 0 and s % keep_every == 0)]


def prune_checkpoints(ckpt_root: Path, keep_last: int, keep_every: int) -> None:
    """Apply the retention policy (`checkpoints_to_delete`) to the checkpoints in `ckpt_root`; the
    one place that deletes old checkpoints, for the single-file and the DCP format alike."""
    steps = [_step_of(p) for p in list_checkpoints(ckpt_root)]
    for old_step in checkpoints_to_delete(steps, keep_last, keep_every):
        shutil.rmtree(Path(ckpt_root) / f"{STEP_PREFIX}{old_step:06d}", ignore_errors=True)


def _tensor_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def save_checkpoint(ckpt_root: Path, step: int, model_state: dict, optim_state: Any, state: dict,
                    keep: int = 2, keep_every: int = 0) -> Path:
    """Write checkpoint `step` atomically, then apply the retention policy (`keep` newest, plus every
    `keep_every`-th step). Raises CheckpointSaveError, leaving every earlier checkpoint intact, when
    the write fails (full disk, I/O error)."""
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / f"{STEP_PREFIX}{step:06d}"
    tmp = ckpt_root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    try:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob(f"{TMP_PREFIX}*"):  # left by a crash mid-save: never complete
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        files = {}
        for name, obj in zip(TENSOR_FILES, (model_state, optim_state)):
            data = _tensor_bytes(obj)
            if name == "optim.pt" and faults.fires("save_error", step):
                raise OSError(28, "No space left on device (injected by SPEEDGPT_INJECT)")
            atomic_write(tmp / name, data)
            files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        meta = {**state, "step": step, "complete": True, "files": files}
        atomic_write(tmp / "state.json", json.dumps(meta, indent=1).encode())
        if final.exists():  # re-saving a step (e.g. after a rollback): move the old one aside first
            old = ckpt_root / f"{TMP_PREFIX}old-{final.name}-{os.getpid()}"
            os.rename(final, old)
            publish_dir(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            publish_dir(tmp, final)
    except (OSError, RuntimeError) as e:  # torch.save reports write failures as RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        previous = list_checkpoints(ckpt_root)
        kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointSaveError(f"could not write checkpoint step {step} in {ckpt_root} "
                                  f"({type(e).__name__}: {e}); {kept}; {_save_fix(e, ckpt_root, previous)}") from None
    prune_checkpoints(ckpt_root, keep, keep_every)
    return final


def _save_fix(e: BaseException, ckpt_root: Path, previous: list[Path]) -> str:
    """What to do after a failed save: free space (a full disk or quota; torch.save says so only in its
    text), then resume from the intact checkpoint, or start again when there is none."""
    import errno

    full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e)
    first = "free space on that disk" if full else "fix that"
    run = ckpt_root.parent
    if previous:
        return f"{first} (a run that stops here continues with `speedgpt train --resume {run}`)"
    return f"{first} (with no checkpoint to resume from, a run that stops here starts again with --overwrite)"


def _corrupt_fix(path: Path) -> str:
    """A bad checkpoint's way on, by where it stands in its run. The one advice for all named a previous checkpoint
    where none was left, and a resume from an earlier one where a resume loads a later one."""
    from . import SFT_SPEC_FILE

    found = list_checkpoints(path.parent)  # oldest first
    if path not in found:  # no step directory of a run's
        return f"restore it, or delete {path}"
    earlier, later = found[:found.index(path)], found[found.index(path) + 1:]
    if later:  # named with --checkpoint: a resume loads the latest, not this one
        return f"restore it, or name another checkpoint with --checkpoint (the run's latest is {later[-1].name})"
    if earlier:
        return f"delete {path} to resume from the previous checkpoint ({earlier[-1].name})"
    if (path.parent.parent / SFT_SPEC_FILE).is_file():  # sft has no --overwrite
        return (f"restore it, or start the SFT run again in a new --run-dir: no earlier checkpoint is left in "
                f"{path.parent}")
    return (f"restore it, or start the run again: no earlier checkpoint is left in {path.parent} (`speedgpt train` "
            f"can replace the run: --overwrite)")


def verify_files(path: Path, state: dict, names: tuple[str, ...] | None = TENSOR_FILES, fix: str = "") -> None:
    """Check files of checkpoint `path` (those in `names`; None: every file recorded) against the
    size and SHA-256 in its state.json. Checkpoints written before checksums existed have no
    record and are not checked. `fix` ends the message (default: _corrupt_fix's, by the checkpoint's
    place in its run)."""
    fix = fix or _corrupt_fix(path)
    for name, rec in state.get("files", {}).items():
        if names is not None and name not in names:
            continue
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} is missing; {fix}")
        size = f.stat().st_size
        if size != rec["bytes"]:
            raise CheckpointError(f"checkpoint file {f} is {'truncated' if size < rec['bytes'] else 'too long'}: "
                                  f"{size:,} bytes, {rec['bytes']:,} were written; {fix}")
        if sha256_file(f) != rec["sha256"]:
            raise CheckpointError(f"checkpoint file {f} is corrupt: its SHA-256 differs from the one recorded at "
                                  f"save; {fix}")


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def read_state(path: Path, fix: str = "") -> dict:
    """A checkpoint's state.json (any format), or a CheckpointError naming it and `fix` (default:
    delete the checkpoint to resume from the previous one)."""
    path = Path(path)
    fix = fix or "delete the directory to resume from the previous one"
    try:
        state = json.loads((path / "state.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete (no state.json); {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {path}: state.json is corrupt ({e}); {fix}") from None
    if not isinstance(state, dict):  # valid JSON of another shape ([]) was an AttributeError at its first .get
        raise CheckpointError(f"checkpoint {path}: state.json is corrupt (a JSON {type(state).__name__}, not an "
                              f"object); {fix}")
    return state


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> tuple[dict, Any, dict]:
    """(model_state, optim_state, state) of a checkpoint directory, or a CheckpointError naming it."""
    path = Path(path)
    state = read_state(path)
    verify_files(path, state)
    tensors = []
    for name in TENSOR_FILES:
        try:
            tensors.append(torch.load(path / name, map_location=map_location, weights_only=True))
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint {path} is missing {name}; delete the directory to resume from "
                                  f"the previous one") from None
        except Exception as e:  # torch raises several types for truncated, garbled or code-carrying files
            raise CheckpointError(f"checkpoint file {path / name} is unreadable ({type(e).__name__}: "
                                  f"{_first_line(e)}); delete {path} to resume from the previous one") from None
    return tensors[0], tensors[1], state
