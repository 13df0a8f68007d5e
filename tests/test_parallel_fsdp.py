"""FSDP2 (parallel.strategy="fsdp") on CPU ranks (gloo) against the unsharded model.

- Initial weights: the sharded model built on 1 and 2 ranks (4: test_parallel_dcp.py) holds exactly
  the unsharded model's.
- Gradient clipping: the global norm over sharded gradients equals the unsharded norm.
- Training: 2 ranks under FSDP (Muon on sharded matrices, clipping active) give the losses of one
  unsharded rank with the same global batch, within fp32 reduction-order tolerance (rtol 2e-4:
  the sharded run sums two half-batch gradients in a different order, and its Newton-Schulz runs
  per matrix rather than batched by shape); its checkpoint resumes on one rank under ddp.
"""

import shutil

import numpy as np
import torch
import torch.distributed as dist

from distkit import spawn_local
from speedgpt.config import apply_overrides, config_from_plain
from speedgpt.model.build import model_from_config
from speedgpt.parallel.fsdp import build_fsdp_model
from test_parallel_train import make_shards, run_cfg, run_here
from speedgpt.train.loop import train


def full_state(model):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def assert_same_init(cfg, world):
    cpu = torch.device("cpu")
    sharded = full_state(build_fsdp_model(cfg, cpu, world))
    ref = model_from_config(cfg, cpu).state_dict()
    assert set(sharded) == set(ref)
    for k, v in ref.items():
        assert torch.equal(sharded[k], v), f"{k} differs on {world} ranks"


def grad_norms(cfg, world, rank):
    """(sharded norm, unsharded norm) of the gradients of one global batch's mean loss."""
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 64, (4, cfg.data.seq_len), generator=g)
    targets = torch.randint(0, 64, (4, cfg.data.seq_len), generator=g)
    ref = model_from_config(cfg, cpu)
    ref(inputs, targets).backward()
    ref_norm = torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 1e9)
    model = build_fsdp_model(cfg, cpu, world)
    rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
    model(inputs[rows], targets[rows]).backward()
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1e9)
    return norm.full_tensor(), ref_norm


def _train_worker(rank, world, cfg_dict, run_dir, resume, out):
    cfg = config_from_plain(cfg_dict)
    dist.init_process_group("gloo")  # train() uses this group and leaves it to us
    try:
        if out.endswith("first.pt"):  # the checks that need no training, in the same processes
            assert_same_init(cfg, world)
            norm, ref_norm = grad_norms(cfg, world, rank)
            # fp32: two half-batch gradients averaged vs one whole-batch gradient (~1e-5 relative apart)
            torch.testing.assert_close(norm, ref_norm, rtol=1e-4, atol=0)
        res = train(cfg, run_dir=run_dir, resume=resume, quiet=True)
        if rank == 0:
            torch.save({"losses": res.train_losses, "val": res.val_loss}, out)
    finally:
        dist.destroy_process_group()


def fsdp_cfg(data_dir):
    return apply_overrides(run_cfg(data_dir), ["--parallel.strategy=fsdp", "--optim.grad_clip=0.05"])


def test_sharded_init_equals_unsharded_on_one_rank():
    """One rank here (a one-process group); 2 ranks below, 4 in test_parallel_dcp.py."""
    from speedgpt.parallel.dist import ensure_process_group, teardown

    cfg = apply_overrides(run_cfg("unused"), ["--model.num_kv_heads=2", "--train.seed=7"])
    ensure_process_group(torch.device("cpu"))
    try:
        assert_same_init(cfg, 1)
    finally:
        teardown()


def test_fsdp_two_ranks_match_unsharded_and_resume_into_ddp(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    cfg = fsdp_cfg(make_shards(tmp_path / "data"))
    out = tmp_path / "first.pt"
    spawn_local(_train_worker, 2, cfg.to_dict(), str(tmp_path / "E"), False, str(out))
    r = torch.load(out)
    losses_e, val_e = r["losses"], r["val"]

    ddp = apply_overrides(cfg, ["--parallel.strategy=ddp"])
    losses_f, val_f = run_here(ddp, tmp_path / "F")  # one rank, two micro-steps: the same global batch
    assert losses_e[-1] < losses_e[0] - 0.05, f"the run did not learn: {losses_e}"
    np.testing.assert_allclose(losses_e, losses_f, rtol=2e-4, atol=0)
    np.testing.assert_allclose(val_e, val_f, rtol=2e-4)

    # FSDP's step-3 checkpoint (full weights and optimizer state) continues on one rank under ddp.
    shutil.copytree(tmp_path / "E", tmp_path / "G")
    shutil.rmtree(tmp_path / "G" / "checkpoints" / "step_000006")
    (tmp_path / "G" / "metrics.jsonl").unlink(missing_ok=True)
    losses_g, _ = run_here(ddp, tmp_path / "G", resume=True)
    np.testing.assert_allclose(losses_g, losses_e[3:], rtol=2e-4)


def test_one_rank_fsdp_with_checkpointing_and_normuon_steps_like_the_unsharded_model():
    """On a one-process group: FSDP with activation checkpointing and no reshard after forward, and
    ShardedMuon with NorMuon on (its gather-everywhere path) and off (its all-to-all path), take the
    same three optimizer steps as the unsharded model with torch's AdamW and Muon."""
    from speedgpt.optim.build import build_optimizers
    from speedgpt.parallel.dist import ensure_process_group, teardown

    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 64, (2, 32), generator=g)
    ensure_process_group(cpu)
    try:
        for normuon in (False, True):
            cfg = apply_overrides(run_cfg("unused"), ["--parallel.activation_checkpointing=true",
                                                      "--parallel.reshard_after_forward=false",
                                                      f"--optim.normuon={str(normuon).lower()}"])
            sharded = build_fsdp_model(cfg, cpu, 1)
            ref = model_from_config(cfg, cpu)
            opts = build_optimizers(sharded, cfg.optim, cpu, 1, strategy="fsdp")
            ref_opts = build_optimizers(ref, cfg.optim, cpu, 1)
            for _ in range(3):  # zero-initialized head and projections: qkv moves from step 3
                for model, o in ((sharded, opts), (ref, ref_opts)):
                    model(x, x).backward()
                    o.step()
                    model.zero_grad(set_to_none=True)
            got = full_state(sharded)
            for k, v in ref.state_dict().items():
                torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6, msg=f"{k} (normuon={normuon})")
            assert not torch.equal(got["blocks.0.attn.qkv_w"], model_from_config(cfg, cpu).blocks[0].attn.qkv_w)
    finally:
        teardown()


def test_fsdp_reduces_gradients_in_bf16_when_grad_comm_dtype_says_so():
    """parallel.grad_comm_dtype=bf16 is FSDP2's reduce_dtype: even on a one-process group FSDP casts each
    gradient to it for the reduce-scatter and back to fp32, so every reduced gradient is bf16-exact; with
    "param" (fp32 on CPU) none is."""
    from speedgpt.parallel.dist import ensure_process_group, teardown

    cpu = torch.device("cpu")
    x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    ensure_process_group(cpu)
    try:
        for comm, rounded in (("param", False), ("bf16", True)):
            model = build_fsdp_model(apply_overrides(run_cfg("unused"), [f"--parallel.grad_comm_dtype={comm}"]),
                                     cpu, 1)
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():  # every weight nonzero: at init the zero head leaves most gradients exactly 0
                for p in model.parameters():
                    p.to_local().add_(0.05 * torch.randn(p.to_local().shape, generator=g))
            model(x, x).backward()
            grads = {n: p.grad.to_local() for n, p in model.named_parameters()}
            assert all(g.dtype == torch.float32 for g in grads.values())
            exact = {n: torch.equal(g, g.bfloat16().float()) for n, g in grads.items() if g.count_nonzero() > 8}
            assert exact and set(exact.values()) == {rounded}, (comm, exact)
    finally:
        teardown()


def test_fsdp_in_bf16_hands_the_blocks_the_rotation_and_yarn_scale_in_float32_as_ddp_does():
    """The model keeps the rotary tables and YaRN's query scale in float32 (the rotation is computed in float32);
    FSDP2's mixed precision would cast a sharded block's floating inputs to bf16 on every call. With the policy's
    input cast off, a block under FSDP in bf16 gets them as the unsharded model's blocks do: float32, equal."""
    from speedgpt.parallel.dist import ensure_process_group, teardown
    from speedgpt.plan import RunPlan

    cpu = torch.device("cpu")
    cfg = apply_overrides(run_cfg("unused"), ["--model.yarn=true", "--train.dtype=bfloat16",
                                              "--model.paired_head_layers=[1]", "--schedule.window_start=16",
                                              "--schedule.window_end=64", "--schedule.window_block=16"])
    x = torch.randint(0, 64, (1, 32), generator=torch.Generator().manual_seed(0))
    freq, scale = RunPlan.of(cfg).yarn.state(cfg.train.steps // 2)
    seen = {}

    def contexts(model, name):
        seen[name] = []
        for block in model.blocks:
            block.register_forward_pre_hook(lambda _mod, args: seen[name].append(args[5]))
        model(x, x, rope=model.rope_state(freq, scale)).backward()  # a backward: the bf16 path runs end to end

    ensure_process_group(cpu)
    try:
        contexts(build_fsdp_model(cfg, cpu, 1), "fsdp")
    finally:
        teardown()
    contexts(model_from_config(cfg, "cpu"), "plain")
    assert len(seen["fsdp"]) == len(seen["plain"]) == cfg.model.depth
    for sharded, plain in zip(seen["fsdp"], seen["plain"]):
        assert sharded.q_scale.dtype == torch.float32 and torch.equal(sharded.q_scale, plain.q_scale)
        for paired, (cos, sin) in plain.rotary_tables.items():
            assert cos.dtype == sin.dtype == torch.float32
            assert torch.equal(sharded.rotary_tables[paired][0], cos)
            assert torch.equal(sharded.rotary_tables[paired][1], sin)
