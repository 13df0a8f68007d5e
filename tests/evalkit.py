"""Tiny run directories for the eval / sample / export tests, built without training (fast) or with
two real training steps (to check eval against the trainer's own validation)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from speedgpt.config import apply_overrides, load_preset, save_toml
from speedgpt.data.shards import write_shard
from speedgpt.data.tokenizer import BOS_ID
from speedgpt.model.build import build_model
from speedgpt.rundir.checkpoint import save_checkpoint

TINY = ["--model.depth=4", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
        "--model.attn_free_layers=[2]", "--model.window_pattern=LS", "--data.seq_len=64",
        "--data.val_tokens=1024", "--train.batch_tokens=256", "--train.steps=2", "--train.val_every=0",
        "--train.log_every=1", "--train.device=cpu", "--schedule.window_start=64", "--schedule.window_end=64",
        "--schedule.window_block=16", "--schedule.short_window_frac=0.25", "--run.sample_tokens=0",
        "--run.report=false"]


def write_corpus(root: Path, n_train: int = 6000, n_val: int = 3000, seed: int = 0) -> Path:
    """BOS-separated documents of random GPT-2 ids (all decodable, so bits per byte is defined)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        toks = rng.integers(0, 50000, size=n)
        toks[rng.random(n) < 0.03] = BOS_ID
        toks[0] = BOS_ID
        write_shard(root / f"{split}_000000.bin", toks)
    return root


def tiny_config(data_dir: Path, run_dir: Path, extra: list[str] = ()):
    return apply_overrides(load_preset("tiny-cpu"),
                           [*TINY, f"--data.train_files={data_dir}", f"--run.dir={run_dir}", *extra])


def randomize(model, seed: int = 0) -> None:
    """Non-trivial weights (the init zeroes the head and output projections, making every logit equal)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
            else:
                p.copy_(torch.rand(p.shape, generator=g) * 0.8 + 0.2)


def make_run(tmp_path: Path, *, steps: tuple[int, ...] = (2,), prefix: str = "", tie: bool = False,
             extra: list[str] = ()) -> Path:
    """A run directory as the trainer leaves it (config.toml, metrics.jsonl, checkpoints/step_N/),
    with random weights. `prefix` mimics a compiled model's `_orig_mod.` keys; `tie` makes the head
    share the embedding's storage."""
    data = write_corpus(tmp_path / "data")
    run = tmp_path / "run"
    cfg = tiny_config(data, run, extra)
    run.mkdir(parents=True)
    save_toml(cfg, run / "config.toml")
    (run / "metrics.jsonl").write_text('{"step": 2, "tokens": 512, "time_s": 1.0, "val_loss": 9.9}\n')
    for i, step in enumerate(steps):
        model = build_model(cfg.model, cfg.data.seq_len, "cpu")
        randomize(model, seed=step)
        state = model.state_dict()
        if tie:
            state["lm_head.weight"] = state["embed.weight"]
        state = {prefix + k: v for k, v in state.items()}
        save_checkpoint(run / "checkpoints", step, state, [], {"tokens": 256 * step, "train_time_s": 0.5 * step},
                        keep=0)
    return run
