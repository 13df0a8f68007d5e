"""The later records' switches together (built in parallel by different helpers): a stage table with
MTP, every embedding-side switch with the untie inside the run, the attention switches (key offset,
paired heads, YaRN) and Adam every other step. The warmup must leave no trace, and a resume from
a checkpoint taken between two Adam steps and before the untie must be bit-equal."""

from __future__ import annotations

import math

from speedgpt.config import apply_overrides
from speedgpt.train.loop import train

from distkit import drop_checkpoints_after
from test_embedding_switches import ALL_ON
from test_stages import TABLE

EVERYTHING = ALL_ON + [TABLE, "--model.depth=4", "--model.attn_gate_dim=8", "--model.key_offset=true",
                       "--model.paired_head_layers=[1]", "--model.yarn=true", "--optim.adam_every=2",
                       "--train.checkpoint_every=5", "--train.keep_checkpoints=0", "--train.val_every=0"]
# (checkpoints at steps 5 and 10 only: the resume starts from step 5)


def test_every_switch_together_warms_up_and_resumes_exactly(small_vocab_cfg, tmp_path):
    cfg = apply_overrides(small_vocab_cfg, EVERYTHING)
    full = train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert len(full.train_losses) == 12 and all(math.isfinite(x) for x in full.train_losses)
    assert not full.model.embed_tied
    warm = train(apply_overrides(cfg, ["--train.warmup_steps=3", "--train.checkpoint_every=0",
                                       "--train.save_final_checkpoint=false"]), run_dir=tmp_path / "warm", quiet=True)
    assert warm.train_losses == full.train_losses
    # step 5: inside stage 0 (MTP), Adam's gradients of step 4 waiting, the untie (step 6) ahead
    drop_checkpoints_after(tmp_path / "run", 5)
    resumed = train(cfg, run_dir=tmp_path / "run", resume=True, quiet=True)
    assert resumed.train_losses == full.train_losses[5:]  # bitwise on CPU
    assert resumed.val_loss == full.val_loss
