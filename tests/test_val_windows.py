"""Validation scores the model at the attention windows of the step it scores (record #28's val loop
calls get_window_size_blocks(step)), in training and in `speedgpt eval` of a mid-run checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from speedgpt.config import apply_overrides
from speedgpt.data.val import val_batches
from speedgpt.eval.run import evaluate_run, resolve_eval_files
from speedgpt.infer.load import load_model
from speedgpt.optim.schedules import attention_windows

pytestmark = pytest.mark.usefixtures("one_thread")

# Real text, and a window that grows from 1 block of 16 tokens to 4 (= seq_len 64) over 8 steps.
# On the CPU everywhere: the point is the window bookkeeping, and on a GPU machine tiny-cpu's "auto" device would
# compile FlexAttention at head_dim 16, which Inductor cannot lower there (seen on an H100, torch 2.11).
GROWING = ["--train.device=cpu", "--train.steps=8", "--train.val_every=4", "--train.checkpoint_every=4", "--train.keep_checkpoints=10",
           "--schedule.window_start=16", "--schedule.window_end=64"]


def direct_val_loss(model, cfg, windows) -> float:
    # On the model's device: on a GPU machine tiny-cpu's device "auto" trains (and loads) on CUDA.
    batches = val_batches(resolve_eval_files(cfg, None, "val"), seq_len=cfg.data.seq_len, batch_size=8,
                          max_tokens=cfg.data.val_tokens, device=next(model.parameters()).device)
    return torch.cat([model(x, y, reduction="none", windows=windows) for x, y in batches]).double().mean().item()


def test_training_and_eval_validate_at_the_windows_of_the_scored_step(tiny_cfg, tmp_path):
    from speedgpt.train.loop import train

    cfg = apply_overrides(tiny_cfg, GROWING + [f"--run.dir={tmp_path / 'run'}"])
    result = train(cfg, quiet=True)
    mid, final = attention_windows(cfg.schedule, 4, 8), attention_windows(cfg.schedule, 8, 8)
    assert mid[0] < final[0]  # the schedule really grows
    val_at = dict(result.val_history)

    model, _ = load_model(tmp_path / "run", checkpoint=4, device="cpu")
    assert model.windows == mid  # eval of a mid-run checkpoint finds its step's windows
    at_step = direct_val_loss(model, cfg, mid)
    at_final = direct_val_loss(model, cfg, final)
    assert val_at[4] == pytest.approx(at_step, rel=2e-7)  # training's step-4 validation...
    assert not math.isclose(val_at[4], at_final, rel_tol=1e-6)  # ... is not the final windows' loss

    rec = evaluate_run(tmp_path / "run", checkpoint=4, device="cpu", log=False, print_fn=lambda *a: None)
    assert rec["val_loss"] == pytest.approx(at_step, rel=2e-7)

    model, _ = load_model(tmp_path / "run", device="cpu")  # the last checkpoint: the final windows
    assert model.windows == final
    assert val_at[8] == pytest.approx(direct_val_loss(model, cfg, final), rel=1e-6)
