"""Distributed checkpoints (train.checkpoint_format=dcp / dcp_async) across world sizes and strategies.

One run, reused: FSDP on 4 gloo ranks (1 micro-step each), 4 steps, checkpoints written in the
background at steps 2 and 4 (its processes also check that the sharded initial weights equal the
unsharded model's on 4 ranks, with uneven shards: qkv_w's first dim is 3). Then its step-2
checkpoint resumes on 2 ranks under fsdp (2 micro-steps each) and on 1 rank under ddp (4
micro-steps), both continuing with its losses (rtol 2e-4: fp32 reduction order); and
`speedgpt export` consolidates its last checkpoint into the weights the run ended with.
"""


import numpy as np
import torch
import torch.distributed as dist

from distkit import copy_without_checkpoint, spawn_local
from speedgpt.config import apply_overrides, config_from_plain
from speedgpt.data.tokenizer import BOS_ID
from speedgpt.rundir.dcp import read_model_state
from test_parallel_fsdp import assert_same_init
from test_parallel_train import make_shards, run_cfg, run_here
from speedgpt.train.loop import train


def _worker(rank, world, cfg_dict, run_dir, resume, out, check_init):
    cfg = config_from_plain(cfg_dict)
    dist.init_process_group("gloo")
    try:
        if check_init:
            assert_same_init(cfg, world)
        res = train(cfg, run_dir=run_dir, resume=resume, quiet=True)
        if rank == 0:
            torch.save({"losses": res.train_losses, "weights": res.model.state_dict()}, out)
    finally:
        dist.destroy_process_group()


def run(cfg, world, run_dir, tmp, resume=False, check_init=False):
    out = tmp / f"result-{run_dir.name}.pt"
    spawn_local(_worker, world, cfg.to_dict(), str(run_dir), resume, str(out), check_init)
    return torch.load(out)


def step2_copy(run_dir, dest):
    return copy_without_checkpoint(run_dir, dest, 4)


def test_dcp_fsdp_4_ranks_resumes_on_2_and_into_ddp_and_exports(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    # GPT-2's ids: the export at the end checks the model's vocabulary against the run's tokenizer (GPT-2's)
    cfg = apply_overrides(run_cfg(make_shards(tmp_path / "data", bos=BOS_ID), bos=BOS_ID), [
        "--parallel.strategy=fsdp", "--train.checkpoint_format=dcp_async", "--train.steps=4",
        "--train.checkpoint_every=2", "--train.micro_batch_size=2", "--optim.muon_momentum_warmup_steps=3",
        "--model.num_kv_heads=2"])
    a = run(cfg, 4, tmp_path / "A", tmp_path, check_init=True)
    ckpts = sorted(p.name for p in (tmp_path / "A" / "checkpoints").iterdir())
    assert ckpts == ["step_000002", "step_000004"]  # published; no temporary left behind
    assert len(list((tmp_path / "A" / "checkpoints" / "step_000004" / "dcp").glob("*.distcp"))) == 4

    b = run(apply_overrides(cfg, ["--train.checkpoint_format=dcp"]), 2,
            step2_copy(tmp_path / "A", tmp_path / "B"), tmp_path, resume=True)
    np.testing.assert_allclose(b["losses"], a["losses"][2:], rtol=2e-4)

    ddp = apply_overrides(cfg, ["--parallel.strategy=ddp", "--train.checkpoint_format=full"])
    losses_c, _ = run_here(ddp, step2_copy(tmp_path / "A", tmp_path / "C"), resume=True)
    np.testing.assert_allclose(losses_c, a["losses"][2:], rtol=2e-4)

    # Consolidated in one process, with no process group: the weights the 4-rank run ended with.
    state = read_model_state(tmp_path / "A" / "checkpoints" / "step_000004")
    assert set(state) == set(a["weights"])
    for k, v in a["weights"].items():
        assert torch.equal(state[k], v), k
    from speedgpt.export import export_model
    from speedgpt.infer.load import load_model

    model, _ = load_model(export_model(tmp_path / "A", tmp_path / "export", dtype="fp32"))
    assert torch.equal(model.state_dict()["blocks.0.attn.q_w"], a["weights"]["blocks.0.attn.q_w"])
