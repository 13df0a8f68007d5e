"""Whole training runs on 1 and 2 CPU ranks (gloo): same losses, checkpoints that move between world sizes.

One scenario, run once (the runs are the expensive part):
  A: 2 ranks x 1 micro-step, 6 steps, checkpoints at steps 3 and 6 (written once, by rank 0)
  B: 1 rank x 2 micro-steps (grad accumulation), same global batch: same losses as A
  C: A's step-3 checkpoint resumed on 1 rank: continues with A's losses
  D: B's step-3 checkpoint resumed on 2 ranks: continues with B's losses
"""

import json

import numpy as np
import torch

from speedgpt.config import apply_overrides, config_from_plain, load_preset
from speedgpt.data.shards import write_shard
from distkit import copy_without_checkpoint, spawn_local
from speedgpt.train.loop import train

# The documents' ids are 0..63 and their BOS is 64: a 65-id vocabulary (padded to 128) keeps the head, the
# loss, the embedding tables, their optimizer state and checkpoints small (GPT-2's 50K ids cost 30x the blocks).
BOS = 64


def make_shards(root, bos=BOS):
    """'Documents' of 5..60 tokens, each starting with `bos`: counting mod 64 from a random start, so
    a few steps visibly lower the loss. A run that needs its ids to be GPT-2's (an export checks the model
    against its tokenizer) passes GPT-2's BOS here and to run_cfg."""
    rng = np.random.default_rng(0)
    toks = []
    while len(toks) < 30_000:
        start, n = int(rng.integers(0, 64)), int(rng.integers(4, 60))
        toks += [bos] + [(start + i) % 64 for i in range(n)]
    root.mkdir()
    write_shard(root / "train_000000.bin", toks[:20_000])
    write_shard(root / "val_000000.bin", toks[20_000:])
    return root


def run_cfg(data_dir, bos=BOS):
    return apply_overrides(load_preset("tiny-cpu"), run_overrides(data_dir, bos))


def run_overrides(data_dir, bos=BOS):
    """run_cfg's overrides of the tiny-cpu preset, as `speedgpt train` takes them."""
    return [
        "--model.depth=2", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
        f"--model.vocab_size={bos + 1}", f"--model.bos_id={bos}", "--data.seq_len=32",
        f"--data.train_files={data_dir}/train_*.bin", f"--data.val_files={data_dir}/val_*.bin",
        # 15 validation rows: 8 on rank 0 and 7 on rank 1 score the same rows as one rank does
        "--data.val_tokens=480", "--train.batch_tokens=256", "--train.micro_batch_size=4", "--train.steps=6",
        "--train.checkpoint_every=3", "--train.keep_checkpoints=0", "--train.val_every=0", "--train.log_every=1",
        "--train.device=cpu", "--run.sample_tokens=0", "--run.report=false",
        "--schedule.window_start=32", "--schedule.window_end=32", "--schedule.window_block=16",
        "--optim.muon_momentum_warmup_steps=4",  # the momentum schedule changes inside the run
    ]


def _train_worker(rank, world, cfg_dict, run_dir, resume, out):
    res = train(config_from_plain(cfg_dict), run_dir=run_dir, resume=resume, quiet=True)
    if rank == 0:
        torch.save({"losses": res.train_losses, "val": res.val_loss}, out)


def run_here(cfg, run_dir, resume=False, extend=False):
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: a second OpenMP thread only adds contention
    try:
        res = train(cfg, run_dir=run_dir, resume=resume, quiet=True, extend=extend)
    finally:
        torch.set_num_threads(n)
    return res.train_losses, res.val_loss


def run_two(cfg, run_dir, tmp, resume=False):
    out = tmp / f"result-{run_dir.name}.pt"
    spawn_local(_train_worker, 2, cfg.to_dict(), str(run_dir), resume, str(out))
    r = torch.load(out)
    return r["losses"], r["val"]


def resume_copy(run_dir, dest):
    return copy_without_checkpoint(run_dir, dest, 6)


def test_two_ranks_match_one_rank_and_resume_across_world_sizes(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    cfg = run_cfg(make_shards(tmp_path / "data"))

    losses_a, val_a = run_two(cfg, tmp_path / "A", tmp_path)
    losses_b, val_b = run_here(cfg, tmp_path / "B")
    assert len(losses_a) == len(losses_b) == 6
    assert losses_a[-1] < losses_a[0] - 0.05, f"the run did not learn: {losses_a}"
    np.testing.assert_allclose(losses_a, losses_b, rtol=2e-4, atol=0)
    np.testing.assert_allclose(val_a, val_b, rtol=2e-4)

    # Written once by rank 0, in full (unsharded) form: shapes are the parameters'.
    ckpts = sorted(p.name for p in (tmp_path / "A" / "checkpoints").iterdir())
    assert ckpts == ["step_000003", "step_000006"]
    model_sd = torch.load(tmp_path / "A" / "checkpoints" / "step_000006" / "model.pt")
    optim_sd = torch.load(tmp_path / "A" / "checkpoints" / "step_000006" / "optim.pt")
    assert optim_sd["adam"]["embed.weight"]["exp_avg"].shape == model_sd["embed.weight"].shape
    assert set(optim_sd["muon"]) == {k for k, v in model_sd.items() if k.startswith("blocks.") and v.ndim >= 2}

    # Exposed communication is logged on logging steps of the multi-rank run.
    records = [json.loads(line) for line in (tmp_path / "A" / "metrics.jsonl").read_text().splitlines()]
    waits = [r["comm_wait_ms"] for r in records if "comm_wait_ms" in r]
    assert len(waits) >= 5 and all(w >= 0 for w in waits)

    # 2 -> 1 rank: A's step-3 checkpoint continues on one rank with A's losses.
    losses_c, val_c = run_here(cfg, resume_copy(tmp_path / "A", tmp_path / "C"), resume=True)
    np.testing.assert_allclose(losses_c, losses_a[3:], rtol=2e-4)
    np.testing.assert_allclose(val_c, val_a, rtol=2e-4)

    # 1 -> 2 ranks: B's step-3 checkpoint (torch AdamW + Muon state) continues sharded with B's losses.
    losses_d, val_d = run_two(cfg, resume_copy(tmp_path / "B", tmp_path / "D"), tmp_path, resume=True)
    np.testing.assert_allclose(losses_d, losses_b[3:], rtol=2e-4)
    np.testing.assert_allclose(val_d, val_b, rtol=2e-4)
