"""optim.adam_every (record #39): Adam's parameters step every N optimizer steps on the sum of the N
steps' gradients, Muon every step; the waiting gradients are checkpointed state, so resume is
exact, and 1 and 2 ranks compute the same run (gloo)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from distkit import copy_without_checkpoint, drop_checkpoints_after, spawn_local
from speedgpt import faults
from speedgpt.config import ConfigError, apply_overrides, config_from_plain, load_preset
from speedgpt.model.build import build_model
from speedgpt.optim.build import build_optimizers
from speedgpt.plan import validate
from speedgpt.rundir.checkpoint import load_checkpoint
from speedgpt.train.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")

# 512 validation tokens (one batch): the tests compare validation losses between runs, whatever their size.
RUN = ["--train.steps=8", "--train.val_every=4", "--train.log_every=4", "--train.checkpoint_every=3",
       "--train.keep_checkpoints=0", "--optim.adam_every=2", "--data.val_tokens=512"]


def test_adam_steps_every_other_step_on_the_summed_gradients_and_muon_every_step():
    cfg = apply_overrides(load_preset("tiny-cpu"), ["--model.depth=2", "--model.model_dim=64", "--model.head_dim=16",
                                                    "--optim.adam_every=2"])
    model = build_model(cfg.model, 32, "cpu", seed=0)
    opts = build_optimizers(model, cfg.optim, torch.device("cpu"))
    embed, matrix = model.embed.weight, model.blocks[0].attn.qkv_w
    ref = torch.nn.Parameter(embed.detach().clone())
    ref_opt = torch.optim.AdamW([ref], lr=opts.adam.param_groups[0]["lr"], betas=(cfg.optim.adam_beta1,
                                cfg.optim.adam_beta2), eps=cfg.optim.adam_eps, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    grads = [{p: torch.randn(p.shape, generator=g) for p in model.parameters()} for _ in range(2)]

    start_embed, start_matrix = embed.detach().clone(), matrix.detach().clone()
    for step, gs in enumerate(grads):
        for p in model.parameters():
            p.grad = gs[p].clone()
        opts.step(step)
        model.zero_grad(set_to_none=True)
        if step == 0:
            assert torch.equal(embed, start_embed)  # Adam waits ...
            assert not torch.equal(matrix, start_matrix)  # ... Muon does not
            assert torch.equal(opts.pending[embed], grads[0][embed])
    ref.grad = grads[1][embed] + grads[0][embed]
    ref_opt.step()
    torch.testing.assert_close(embed, ref, rtol=0, atol=0)  # one Adam step on the sum, bit for bit
    assert opts.pending[embed].abs().sum() == 0  # used up
    with pytest.raises(ValueError, match="step number"):
        opts.step()


def test_adam_every_must_be_positive():
    with pytest.raises(ConfigError, match="adam_every"):
        validate(apply_overrides(load_preset("tiny-cpu"), ["--optim.adam_every=0"]))


def test_switch_changes_training_and_resume_between_adam_steps_is_bit_exact(small_vocab_cfg, tmp_path):
    cfg = apply_overrides(small_vocab_cfg, RUN)
    off = train(apply_overrides(cfg, ["--optim.adam_every=1"]), run_dir=tmp_path / "off", quiet=True)
    full = train(cfg, run_dir=tmp_path / "full", quiet=True)
    assert full.train_losses[0] == off.train_losses[0]
    assert full.train_losses[2:] != off.train_losses[2:]  # the switch changes the run

    # The step-3 checkpoint lies between two Adam steps (step index 2 was skipped): gradients wait in it.
    _, optim, _ = load_checkpoint(tmp_path / "full" / "checkpoints" / "step_000003")
    pending = optim["adam_pending"]
    assert set(pending) == set(optim["adam"]) and pending["embed.weight"]["grad"].abs().sum() > 0

    resumed_dir = copy_without_checkpoint(tmp_path / "full", tmp_path / "resumed", 8)
    shutil.rmtree(resumed_dir / "checkpoints" / "step_000006")  # resume from step 3
    resumed = train(cfg, run_dir=resumed_dir, resume=True, quiet=True)
    assert resumed.train_losses == full.train_losses[3:]  # bitwise on CPU
    assert resumed.val_history == [h for h in full.val_history if h[0] > 3]

    other = copy_without_checkpoint(tmp_path / "full", tmp_path / "other", 8)
    with pytest.raises(ConfigError, match="optim.adam_every: checkpoint 2, config 1 .* add --extend"):
        train(apply_overrides(cfg, ["--optim.adam_every=1"]), run_dir=other, resume=True, quiet=True)
    with pytest.raises(KeyError, match="same optim.adam_every"):  # with --extend: the waiting gradients say it
        train(apply_overrides(cfg, ["--optim.adam_every=1"]), run_dir=other, resume=True, extend=True, quiet=True)


def test_the_trainer_begins_each_step_before_its_backward(small_vocab_cfg, tmp_path, monkeypatch):
    """Optimizers.begin_step(step) (on several ranks: Adam's collectives held when it is not due) comes
    before the step's first backward, once a step."""
    from speedgpt.optim.container import Optimizers

    calls = []
    real = Optimizers.begin_step

    def spy(self, step):
        calls.append((step, any(p.grad is not None for p in self._params(self.adam))))
        real(self, step)

    monkeypatch.setattr(Optimizers, "begin_step", spy)
    train(apply_overrides(small_vocab_cfg, RUN + ["--train.steps=3", "--train.val_every=0",
                                                  "--train.checkpoint_every=0"]), run_dir=tmp_path / "a", quiet=True)
    assert calls == [(0, False), (1, False), (2, False)]


def test_skip_mode_keeps_a_bad_step_out_of_the_waiting_gradients(small_vocab_cfg, tmp_path, monkeypatch):
    """train.on_nonfinite=skip: a NaN at a step where Adam only collects must not reach the next Adam step."""
    cfg = apply_overrides(small_vocab_cfg, RUN + ["--train.on_nonfinite=skip", "--train.checkpoint_every=0"])
    clean = train(cfg, run_dir=tmp_path / "clean", quiet=True)
    reference = train(apply_overrides(cfg, ["--train.on_nonfinite=abort"]), run_dir=tmp_path / "ref", quiet=True)
    assert clean.train_losses == reference.train_losses  # the guard's step is the container's step
    monkeypatch.setenv("SPEEDGPT_INJECT", "nan@2")  # step index 2: Adam collects, does not step
    faults.reset()
    try:
        bad = train(cfg, run_dir=tmp_path / "bad", quiet=True)
    finally:
        faults.reset()
    assert not math.isfinite(bad.train_losses[2])
    assert all(math.isfinite(x) for x in bad.train_losses[3:])
    assert math.isfinite(bad.val_loss)


# -- 1 and 2 ranks (gloo) ------------------------------------------------------------------------------------

def _worker(rank, world, cfg_dict, run_dir, resume, out):
    res = train(config_from_plain(cfg_dict), run_dir=run_dir, resume=resume, quiet=True)
    if rank == 0:
        torch.save({"losses": res.train_losses, "val": res.val_loss}, out)


def run_two(cfg, run_dir, resume=False):
    out = run_dir.parent / f"result-{run_dir.name}.pt"
    spawn_local(_worker, 2, cfg.to_dict(), str(run_dir), resume, str(out))
    r = torch.load(out)
    return r["losses"], r["val"]


def test_two_ranks_match_one_rank_and_resume_across_world_sizes_between_adam_steps(small_vocab_cfg, tmp_path,
                                                                                   monkeypatch):
    """DistAdam keeps its slices of the waiting gradients; the checkpoint holds them whole, so a run
    moves between 1 and 2 ranks at a step where Adam has gradients waiting."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    cfg = apply_overrides(small_vocab_cfg, RUN + ["--train.steps=6", "--train.val_every=0",
                                                  "--train.micro_batch_size=4"])
    two, val_two = run_two(cfg, tmp_path / "A")
    one = train(cfg, run_dir=tmp_path / "B", quiet=True)
    np.testing.assert_allclose(two, one.train_losses, rtol=2e-4, atol=0)
    np.testing.assert_allclose(val_two, one.val_loss, rtol=2e-4)
    _, optim, _ = load_checkpoint(tmp_path / "A" / "checkpoints" / "step_000003")
    _, optim_one, _ = load_checkpoint(tmp_path / "B" / "checkpoints" / "step_000003")
    for name, st in optim_one["adam_pending"].items():  # gathered whole from the two ranks' slices
        torch.testing.assert_close(optim["adam_pending"][name]["grad"], st["grad"], rtol=1e-4, atol=1e-6)

    # 2 -> 1 rank and 1 -> 2 ranks from the step-3 checkpoints; the latter with the numerics guard in skip mode,
    # whose check reads every step's reduced gradients: the trainer has DistAdam reduce them every step there
    c = train(cfg, run_dir=copy_without_checkpoint(tmp_path / "A", tmp_path / "C", 6), resume=True, quiet=True)
    np.testing.assert_allclose(c.train_losses, two[3:], rtol=2e-4)
    skip = apply_overrides(cfg, ["--train.on_nonfinite=skip"])
    d, _ = run_two(skip, copy_without_checkpoint(tmp_path / "B", tmp_path / "D", 6), resume=True)
    np.testing.assert_allclose(d, one.train_losses[3:], rtol=2e-4)


def test_fsdp_keeps_the_waiting_gradients_as_shards_and_moves_them_to_and_from_ddp(small_vocab_cfg, tmp_path):
    """Under fsdp the waiting gradients are DTensor shards, saved whole (here on a one-process group)."""
    cfg = apply_overrides(small_vocab_cfg, RUN + ["--train.steps=6", "--train.val_every=0"])
    fsdp = apply_overrides(cfg, ["--parallel.strategy=fsdp"])
    a = train(fsdp, run_dir=tmp_path / "A", quiet=True)
    b = train(cfg, run_dir=tmp_path / "B", quiet=True)
    np.testing.assert_allclose(a.train_losses, b.train_losses, rtol=1e-6)
    c = train(cfg, run_dir=copy_without_checkpoint(tmp_path / "A", tmp_path / "C", 6), resume=True, quiet=True)
    np.testing.assert_allclose(c.train_losses, a.train_losses[3:], rtol=1e-6)
    d = train(fsdp, run_dir=copy_without_checkpoint(tmp_path / "B", tmp_path / "D", 6), resume=True, quiet=True)
    np.testing.assert_allclose(d.train_losses, b.train_losses[3:], rtol=1e-6)


def test_dcp_checkpoints_keep_the_waiting_gradients(small_vocab_cfg, tmp_path):
    """train.checkpoint_format=dcp stores them as optim/adam_pending/<name>/grad: resume is bit-exact."""
    cfg = apply_overrides(small_vocab_cfg, RUN + ["--train.steps=6", "--train.val_every=0",
                                                  "--train.checkpoint_format=dcp"])
    full = train(cfg, run_dir=tmp_path / "full", quiet=True)
    resumed = train(cfg, run_dir=copy_without_checkpoint(tmp_path / "full", tmp_path / "resumed", 6), resume=True,
                    quiet=True)
    assert resumed.train_losses == full.train_losses[3:]


def test_bench_times_steps_with_and_without_adam():
    # bench's spread positions (multiples of total // steps) were all even for 1000 steps timed 10
    # times: with adam_every=2 it timed only steps on which Adam does not step.
    from speedgpt.bench import timed_steps
    from speedgpt.optim.container import Optimizers

    opts = Optimizers(None, None, {}, None, adam_every=2)
    for at in (None, 500):
        steps = timed_steps(1000, 10, at, adam_every=2)
        assert sum(opts.adam_due(s) for s in steps) == 5 and all(0 <= s < 1000 for s in steps)
    assert timed_steps(1000, 10) == [i * 100 for i in range(10)]  # adam_every=1: as before


# -- with model.tie_embed_frac: the untie between two Adam steps ----------------------------------------------

def test_untie_step_moves_back_to_the_start_of_its_adam_window():
    from speedgpt.model.embeddings import EmbedTying

    assert EmbedTying(0.625).untie_step(8) == 5  # ceil(frac x steps), as before, with adam_every=1
    assert EmbedTying(0.625).untie_step(8, adam_every=2) == 4  # step 5 lies in the window of steps 4, 5
    assert EmbedTying(0.5).untie_step(8, adam_every=2) == 4  # already a window's first step
    assert EmbedTying(0.75).untie_step(12, adam_every=4) == 8
    assert EmbedTying(1.0).untie_step(9, adam_every=2) == 9  # tied throughout stays tied throughout


def test_an_untie_between_adam_steps_trains_as_if_untied_at_the_start_of_that_adam_window(small_vocab_cfg, tmp_path):
    """Steps 4 and 5 share one Adam step (adam_every=2). An untie due at step 5 must not leave step 4's
    embedding-lookup gradient waiting on the head (the tied head's pending sum holds both uses): the run
    equals the one untied at step 4, and resumes bit-equal from a checkpoint between the two Adam steps."""
    # Checkpoints only at step 5 (between the Adam steps 4 and 6) and the end: one save a step cost most of the time.
    cfg = apply_overrides(small_vocab_cfg, RUN + ["--train.checkpoint_every=5", "--train.val_every=0"])
    at_window_start = train(apply_overrides(cfg, ["--model.tie_embed_frac=0.5"]), run_dir=tmp_path / "a", quiet=True)
    mid = apply_overrides(cfg, ["--model.tie_embed_frac=0.625"])  # ceil(0.625 x 8) = 5: between Adam steps
    between = train(mid, run_dir=tmp_path / "b", quiet=True)
    assert not between.model.embed_tied
    assert between.train_losses == at_window_start.train_losses
    for (name, p), q in zip(between.model.named_parameters(), at_window_start.model.parameters()):
        assert torch.equal(p, q), name

    # The step-5 checkpoint: untied, step 4's gradients waiting on the head and on the embedding
    _, optim, _ = load_checkpoint(tmp_path / "b" / "checkpoints" / "step_000005")
    for name in ("embed.weight", "lm_head.weight"):
        assert optim["adam_pending"][name]["grad"].abs().sum() > 0, name
    resumed_dir = copy_without_checkpoint(tmp_path / "b", tmp_path / "resumed", 8)
    drop_checkpoints_after(resumed_dir, 5)
    resumed = train(mid, run_dir=resumed_dir, resume=True, quiet=True)
    assert resumed.train_losses == between.train_losses[5:]  # bitwise on CPU


def test_fsdp_folds_the_tied_embeddings_gradient_as_shards(small_vocab_cfg, tmp_path):
    """model.tie_embed_frac under fsdp (a one-process group): the embedding's reduced gradient joins the head's
    as DTensor shards of one layout, and the head's values are copied back; the losses are ddp's through the
    untie (step 2 of 6, an Adam window's start)."""
    cfg = apply_overrides(small_vocab_cfg, RUN + ["--train.steps=6", "--train.val_every=0", "--train.checkpoint_every=0",
                                                  "--model.tie_embed_frac=0.5"])
    fsdp = train(apply_overrides(cfg, ["--parallel.strategy=fsdp"]), run_dir=tmp_path / "A", quiet=True)
    ddp = train(cfg, run_dir=tmp_path / "B", quiet=True)
    np.testing.assert_allclose(fsdp.train_losses, ddp.train_losses, rtol=1e-6)
    assert not fsdp.model.embed_tied
