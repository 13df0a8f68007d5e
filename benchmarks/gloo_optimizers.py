"""What the benchmarks that count a preset's own optimizers on gloo ranks share (dist_muon_ops.py,
dist_step_collectives.py): the command-line checks, the process group, and the model and optimizers as the
trainer builds them, at a small width (the counts do not depend on it)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist


def add_preset_arguments(ap: argparse.ArgumentParser, preset: str) -> None:
    ap.add_argument("--preset", default=preset)
    ap.add_argument("--width", type=int, default=128, help="model_dim for the count (default 128; the count "
                    "does not depend on it)")


def require_torchrun(ap: argparse.ArgumentParser, script: str) -> None:
    if "RANK" not in os.environ:
        ap.error(f"run it under torchrun: PYTHONPATH=. torchrun --standalone --nproc_per_node=4 "
                 f"benchmarks/{Path(script).name}")


def preset_optimizers(ap: argparse.ArgumentParser, args: argparse.Namespace):
    """(the preset's config, the config at --width, the model, its Optimizers) on this gloo rank; a bad preset
    name is argparse's one-line error."""
    from speedgpt.config import ConfigError, apply_overrides, load_preset
    from speedgpt.model.build import build_model
    from speedgpt.optim.build import build_optimizers

    try:
        full = load_preset(args.preset)
        cfg = apply_overrides(full, [f"--model.model_dim={args.width}", "--model.head_dim=32"])
    except ConfigError as e:
        ap.error(str(e))
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = build_model(cfg.model, 64, "cpu")
    return full, cfg, model, build_optimizers(model, cfg.optim, torch.device("cpu"))
