"""Atomic checkpoints and exact resume.

A checkpoint is a directory `step_NNNNNN/` with `model.pt`, `optim.pt` and `state.json`. It is
written under a temporary name, fsynced, then renamed, so a crash leaves either the whole
checkpoint or none of it; `state.json` is written last and marks it complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ..atomic import atomic_dir

STEP_PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint is missing or unreadable; the message says which and what to do."""


def save_checkpoint(ckpt_root: Path, step: int, model_state: dict, optim_state: Any, state: dict,
                    keep: int = 2) -> Path:
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / f"{STEP_PREFIX}{step:06d}"
    # re-saving the same step (e.g. after resume) replaces it
    with atomic_dir(final) as tmp:
        torch.save(model_state, tmp / "model.pt")
        torch.save(optim_state, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps({**state, "step": step, "complete": True}, indent=1))
    if keep > 0:
        for old in list_checkpoints(ckpt_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first. Temporary (half-written) directories are ignored."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir()
             if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.name[len(STEP_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(STEP_PREFIX):]))  # numeric: step 1000000 > 999999


def latest_checkpoint(ckpt_root: Path) -> Path:
    found = list_checkpoints(ckpt_root)
    if not found:
        raise CheckpointError(f"no checkpoint in {ckpt_root}; nothing to resume (train without --resume to start)")
    return found[-1]


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> tuple[dict, Any, dict]:
    """(model_state, optim_state, state) of a checkpoint directory, or a CheckpointError naming it."""
    path = Path(path)
    state_file = path / "state.json"
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is incomplete (no state.json); delete it to resume from "
                              f"the previous one") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {path}: state.json is corrupt ({e}); delete the directory to "
                              f"resume from the previous one") from None
    try:
        model_state = torch.load(path / "model.pt", map_location=map_location, weights_only=True)
        optim_state = torch.load(path / "optim.pt", map_location=map_location, weights_only=True)
    except FileNotFoundError as e:
        raise CheckpointError(f"checkpoint {path} is missing {Path(e.filename).name}; delete the directory to "
                              f"resume from the previous one") from None
    except Exception as e:  # torch raises several types for truncated or garbled files
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e)[:120]}); delete "
                              f"the directory to resume from the previous one") from None
    return model_state, optim_state, state
