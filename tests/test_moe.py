"""Mixture-of-Experts MLP: routing, the balancing bias, grouped matmul against the per-expert loop,
Muon per expert, active-parameter counting, and the expert load in the metrics and the report."""

import json

import pytest
import torch

from speedgpt.config import ModelConfig, apply_overrides
from speedgpt.model.build import build_model
from speedgpt.model.moe import (MoE, balance_experts, choose_experts, expert_hidden, experts_grouped, experts_loop,
                                 moe_health, route, router_logits)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_routing_picks_top_k_of_affinity_plus_bias_and_weights_by_affinity_alone():
    x = torch.eye(4)  # token i has affinity logit router[e, i] for expert e
    router = torch.tensor([[3.0, 0, 0, 0], [2.0, 1, 0, 0], [1.0, 2, 0, 0], [0.0, 3, 0, 0]])
    idx, w = route(x, router, torch.zeros(4), top_k=2)
    assert sorted(idx[0].tolist()) == [0, 1] and sorted(idx[1].tolist()) == [2, 3]
    s = torch.sigmoid(router[:, 0])
    pick = {e: wt for e, wt in zip(idx[0].tolist(), w[0].tolist())}
    assert pick[0] == pytest.approx((s[0] / (s[0] + s[1])).item())  # normalized over the chosen two
    # A bias changes which experts are chosen, not how much the chosen ones weigh.
    idx_b, w_b = route(x, router, torch.tensor([0.0, 0.0, 0.0, 10.0]), top_k=2)
    assert sorted(idx_b[0].tolist()) == [0, 3]
    pick = {e: wt for e, wt in zip(idx_b[0].tolist(), w_b[0].tolist())}
    assert pick[3] == pytest.approx((s[3] / (s[0] + s[3])).item())


def test_routing_weights_stay_finite_when_every_chosen_affinity_underflows():
    # moe-d12's non-finite loss (step 186, docs/experiments.md): router logits of a few hundred made every
    # chosen sigmoid 0 in fp32, and the normalization s_i / sum_j s_j 0/0. The weights are the same function
    # of the logits (exp(l) / sum exp(l) where sigmoid(l) ~ exp(l)) and must stay finite, with gradients.
    logits = torch.tensor([[-300.0, -200.0, -201.0, -250.0], [-120.0, 4.0, 0.0, -90.0]], requires_grad=True)
    idx, w = choose_experts(logits, torch.zeros(4), top_k=2)
    # (which two the first token gets is a tie: all four sigmoids are 0 in fp32)
    assert w[0].tolist() == pytest.approx(torch.softmax(logits[0, idx[0]].detach(), 0).tolist())
    assert sorted(idx[1].tolist()) == [1, 2]
    s = torch.sigmoid(torch.tensor([4.0, 0.0]))  # ordinary logits: still s_i / sum_j s_j
    pick = dict(zip(idx[1].tolist(), w[1].tolist()))
    assert [pick[1], pick[2]] == pytest.approx((s / s.sum()).tolist())
    (w * torch.tensor([[1.0, -1.0], [2.0, 0.5]])).sum().backward()
    assert torch.isfinite(w).all() and torch.isfinite(logits.grad).all() and logits.grad[0].abs().sum() > 0


def test_bias_moves_load_towards_balance():
    moe = MoE(8, 32, experts=4, top_k=1, shared=0)
    moe.init_buffers()
    moe.load.copy_(torch.tensor([10.0, 2.0, 4.0, 0.0]))  # mean 4
    model = torch.nn.Sequential(moe)
    balance_experts(model, rate=0.01)
    assert moe.expert_bias.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.01])
    assert moe.load.sum() == 0 and moe.load_since_log.tolist() == [10.0, 2.0, 4.0, 0.0]


def test_a_negative_bias_rate_is_refused_in_one_line():
    from speedgpt.config import ConfigError, load_preset
    from speedgpt.plan import validate

    cfg = apply_overrides(load_preset("moe-d12"), ["--model.moe_bias_rate=-0.01"])
    with pytest.raises(ConfigError, match="moe_bias_rate=-0.01 must be >= 0"):
        validate(cfg)


def test_checkpointed_experts_in_a_whole_model_compile_are_refused_in_one_line():
    from speedgpt.config import ConfigError, load_preset
    from speedgpt.plan import validate

    cfg = apply_overrides(load_preset("moe-d12"), ["--parallel.activation_checkpointing=true"])
    with pytest.raises(ConfigError, match="moe_experts=8.*set --train.compile_scope=block"):
        validate(cfg)
    for fix in ("--train.compile_scope=block", "--parallel.strategy=fsdp", "--train.compile=false"):
        validate(apply_overrides(cfg, [fix]))


def test_grouped_matmul_equals_per_expert_loop_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    E, H, D = 4, 16, 8
    counts = torch.tensor([3, 0, 5, 2])  # an expert with no tokens too
    x = torch.randn(int(counts.sum()), D, generator=g, requires_grad=True)
    w1 = torch.randn(E, H, D, generator=g, requires_grad=True)
    w2 = torch.randn(E, D, H, generator=g, requires_grad=True)
    up = torch.randn(int(counts.sum()), D, generator=g)
    outs = []
    for fn in (lambda: experts_grouped(x, w1, w2, counts), lambda: experts_loop(x, w1, w2, counts)):
        y = fn()
        grads = torch.autograd.grad((y * up).sum(), (x, w1, w2))
        outs.append((y.detach(), *grads))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert outs[0][2][1].abs().sum() == 0  # the idle expert gets no gradient


def moe_cfg(**kw):
    base = dict(depth=3, model_dim=64, head_dim=16, value_embeds=1, vocab_size=256, mlp_ratio=4.0,
                moe_experts=4, moe_top_k=2, moe_shared_experts=1, moe_dense_layers=1)
    base.update(kw)
    return ModelConfig(**base)


def test_layer_output_equals_a_dense_reference_and_counts_active_params():
    model = build_model(moe_cfg(), 32)
    moe = model.blocks[1].mlp
    assert isinstance(moe, MoE) and not isinstance(model.blocks[0].mlp, MoE)  # first layer stays dense
    assert moe.hidden == expert_hidden(256, 2, 1) == 96  # iso-FLOP: 256 / 3 rounded up to 16
    with torch.no_grad():
        moe.w2.normal_()
    x = torch.randn(2, 5, 64)
    y = moe(x)
    # Reference: every token through its chosen experts one by one, plus the shared expert.
    idx, w = route(x.reshape(-1, 64), moe.router, moe.expert_bias, 2)
    ref = moe.shared(x.reshape(-1, 64)).clone()
    for t in range(10):
        for j in range(2):
            e = idx[t, j]
            h = torch.relu(x.reshape(-1, 64)[t] @ moe.w1[e].T).square()
            ref[t] += w[t, j] * (h @ moe.w2[e].T)
    torch.testing.assert_close(y.reshape(-1, 64), ref, rtol=1e-5, atol=1e-5)
    expert = 96 * 64 * 2
    inactive = 2 * (4 - 2) * expert  # two MoE layers, two of four experts idle per token
    assert model.active_params() == model.num_params() - inactive


def test_muon_orthogonalizes_each_expert():
    from speedgpt.optim.muon import Muon, newton_schulz

    w = torch.nn.Parameter(torch.zeros(3, 16, 8))
    g = torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(1))
    w.grad = g.clone()
    Muon([w], lr=1.0, momentum=0.0, nesterov=False).step()
    for e in range(3):
        expected = -newton_schulz(g[e]) * (16 / 8) ** 0.5
        torch.testing.assert_close(w.detach()[e], expected, rtol=1e-4, atol=1e-5)


def test_a_router_step_at_moe_d12s_width_moves_a_logit_by_less_than_half_a_unit():
    # Adam moves every router entry by up to its lr per step, so a token's logit x . r_e (x of unit RMS)
    # by up to lr x sum_i |x_i| ~ lr x 0.8 x width. At the scalars' lr (0.04) and width 768 that is ~25 per
    # step: the sigmoid affinities saturated within a few steps and the logits kept growing to fp32
    # underflow (moe-d12 diverged). On the CPU (benchmarks/moe_router.py) routers stepping logits by
    # up to ~0.3 stayed unsaturated and balanced; ~1.2 already fought the balancing bias.
    from speedgpt.config import load_preset
    from speedgpt.optim.build import build_optimizers

    preset = load_preset("moe-d12")
    model = build_model(moe_cfg(model_dim=preset.model.model_dim, head_dim=preset.model.head_dim, depth=2,
                                moe_experts=preset.model.moe_experts), 16)
    opts = build_optimizers(model, preset.optim, torch.device("cpu"))
    router = model.blocks[1].mlp.router
    x = torch.nn.functional.rms_norm(torch.randn(1, router.size(1), generator=torch.Generator().manual_seed(0)),
                                     (router.size(1),))
    for _ in range(3):  # a consistent push: raise every expert's logit for this token
        before = (x @ router.detach().T).clone()
        router.grad = -torch.ones(router.size(0), 1) @ x
        opts.step(0)
        step = (x @ router.detach().T - before).abs().max().item()
        assert 0.05 < step < 0.5, f"a router step moved a logit by {step:.2f}"


def test_routers_step_with_their_own_adam_lr_and_export_in_fp32():
    from speedgpt.config import load_preset
    from speedgpt.export import scalar_param_names
    from speedgpt.optim.build import adam_groups

    cfg = load_preset("moe-d12")
    model = build_model(moe_cfg(), 16)
    groups = {g["name"]: g for g in adam_groups(model, cfg.optim)}
    routers = [b.mlp.router for b in model.blocks[1:]]
    assert groups["router"]["params"] == routers and groups["router"]["lr"] == cfg.optim.router_lr
    assert not any(p is r for p in groups["scalar"]["params"] for r in routers)
    assert {"blocks.1.mlp.router", "blocks.11.mlp.router"} <= scalar_param_names(cfg)


def test_health_reports_training_forwards_since_the_last_report_and_resets():
    model = build_model(moe_cfg(), 32)
    layers = [b.mlp for b in model.blocks[1:]]
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in layers:
            m.router.mul_(20)  # logits of a few units, different per layer
            m.expert_bias.copy_(torch.tensor([0.0, 0.03, -0.02, 0.01]))
            m.w1[1].mul_(3)
    xs = [torch.randn(6, 64, generator=g) for _ in range(2)]
    for x in xs:  # two training forwards, then one without gradients and one in eval mode (neither counted)
        layers[0](x)
    with torch.no_grad():
        layers[0](torch.randn(6, 64, generator=g) * 100)
    layers[0].eval()
    layers[0](torch.randn(6, 64, generator=g) * 100)
    layers[0].train()
    balance_experts(model, rate=0.0)  # the loads since the last balancing step join the metrics' tally
    health = moe_health(model)
    want = max(router_logits(x, layers[0].router).abs().max().item() for x in xs)
    assert health["moe_logit_max"] == [pytest.approx(want, abs=1e-4), 0.0]  # layer 2 ran no forward
    load = torch.zeros(4)
    for x in xs:
        idx, _ = route(x, layers[0].router, layers[0].expert_bias, 2)
        load += torch.bincount(idx.reshape(-1), minlength=4)
    share = load / load.mean()
    assert health["moe_max_load"][0] == pytest.approx(share.max().item(), abs=1e-4)
    assert health["moe_min_load"][0] == pytest.approx(share.min().item(), abs=1e-4)
    assert health["moe_bias_range"] == [pytest.approx(0.05), pytest.approx(0.05)]
    m = layers[0]
    assert health["moe_router_norm"][0] == pytest.approx(m.router.norm(dim=1).max().item(), rel=1e-4)
    assert health["moe_w1_norm"][0] == pytest.approx(m.w1[1].norm().item(), rel=1e-4)  # expert 1: the largest
    assert health["moe_w2_norm"] == [0.0, 0.0]  # zero-initialized
    again = moe_health(model)  # nothing since the last report
    assert again["moe_logit_max"] == [0.0, 0.0] and again["moe_max_load"] == [0.0, 0.0]


def _health_worker(rank, world, out):
    from speedgpt.config import load_preset
    from speedgpt.model.build import model_from_config
    from speedgpt.parallel.dist import init_distributed, teardown
    from speedgpt.parallel.fsdp import build_fsdp_model

    init_distributed("cpu")
    try:
        cfg = apply_overrides(load_preset("tiny-cpu"), [
            "--model.depth=3", "--model.model_dim=64", "--model.head_dim=16", "--model.moe_experts=4",
            "--data.seq_len=16", "--schedule.window_start=16", "--schedule.window_end=16",
            "--schedule.window_block=16"])
        x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(rank))  # each rank its own batch
        result = {}
        for kind, model in (("ddp", model_from_config(cfg, "cpu", world_size=world)),
                            ("fsdp", build_fsdp_model(cfg, torch.device("cpu"), world))):
            model(x, x).backward()
            mine = [m.logit_max.item() for m in model.modules() if isinstance(m, MoE)]
            balance_experts(model, rate=0.0)
            result[kind] = dict(mine=mine, health=moe_health(model))
        (out / f"{rank}.json").write_text(json.dumps(result))
    finally:
        teardown()


def test_health_is_the_same_on_every_rank_and_under_fsdp(tmp_path):
    from distkit import spawn_local

    spawn_local(_health_worker, 2, tmp_path)
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    for kind in ("ddp", "fsdp"):
        assert r0[kind]["health"] == r1[kind]["health"]
        want = [max(a, b) for a, b in zip(r0[kind]["mine"], r1[kind]["mine"])]  # the max over ranks
        assert r0[kind]["health"]["moe_logit_max"] == pytest.approx(want, abs=1e-4)
        assert r0[kind]["mine"] != r1[kind]["mine"]  # (the ranks saw different tokens)
    assert r0["fsdp"]["health"] == r0["ddp"]["health"]  # sharded parameters: the same norms, gathered


def test_training_logs_moe_health_and_report_plots_it(tmp_path, capsys):
    from test_parallel_train import make_shards, run_cfg

    from speedgpt.model.moe import HEALTH_KEYS
    from speedgpt.report import write_report
    from speedgpt.train.loop import train

    cfg = apply_overrides(run_cfg(make_shards(tmp_path / "data")), [
        "--model.depth=3", "--model.moe_experts=4", "--model.moe_top_k=2", "--model.value_embeds=1",
        "--train.steps=3", "--train.checkpoint_every=0", "--model.moe_bias_rate=0.01"])
    res = train(cfg, run_dir=tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "moe_max_load" in r]
    assert len(logged) == 3 and all(len(r[k]) == 2 for r in logged for k in HEALTH_KEYS)  # two MoE layers
    assert all(r["moe_min_load"][i] <= 1.0 <= r["moe_max_load"][i] and r["moe_logit_max"][i] > 0
               for r in logged for i in range(2))
    bias = res.model.blocks[1].mlp.expert_bias
    assert logged[-1]["moe_bias_range"][0] == pytest.approx((bias.max() - bias.min()).item(), abs=1e-4)
    assert logged[-1]["moe_bias_range"][0] > 0
    assert "| moe logit " in capsys.readouterr().out
    biases = [b.mlp.expert_bias for b in res.model.blocks[1:]]
    assert all(b.abs().sum() > 0 for b in biases)  # balanced after each step, outside the gradient
    assert "blocks.1.mlp.expert_bias" in res.model.state_dict()  # checkpointed with the weights
    paths = write_report([tmp_path / "run"], tmp_path / "run")
    assert paths["png"].stat().st_size > 0


def grouped_runtime(cfg):
    """The CUDA path's MoE on the CPU: torch._grouped_mm dispatch, in bf16 (its compiled form takes no other)."""
    from speedgpt.model.runtime import runtime_for

    return runtime_for(cfg, "cpu", dtype=torch.bfloat16).replace(moe_grouped=True)


def compiled_training_forward(model, x, **compile_kwargs):
    """One training forward and backward of `model` under dynamo's eager backend: (graphs, graph breaks)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # reset() keeps them
    try:
        torch.compile(model, backend="eager", dynamic=False, **compile_kwargs)(x, x).backward()
        return counters["stats"]["unique_graphs"], dict(counters["graph_break"])
    finally:
        torch._dynamo.reset()


def test_the_grouped_moe_model_compiles_to_one_graph_and_counts_its_tokens():
    """Issue 34: MoE.forward asked autograd for its graph task (a graph break), so each block became a frame of
    its own, recompiled per block variant and grad mode; moe-d12 passed dynamo's recompile limit (8) and ran
    flex eagerly on the GPU. The whole training forward is one graph now, its buffer updates in it."""
    cfg = moe_cfg(model_dim=32, vocab_size=64, attn_backend="sdpa")
    x = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    eager, compiled = (build_model(cfg, 16, grouped_runtime(cfg)) for _ in range(2))
    eager(x, x).backward()
    graphs, breaks = compiled_training_forward(compiled, x)
    assert (graphs, breaks) == (1, {})
    for a, b in zip(eager.blocks[1:], compiled.blocks[1:]):
        assert a.mlp.load.sum() == 16 * 2 and torch.equal(a.mlp.load, b.mlp.load)  # tokens x top_k, once
        assert b.mlp.logit_max > 0 and torch.equal(a.mlp.logit_max, b.mlp.logit_max)


@pytest.mark.parametrize("scope", ["model", "block"])
def test_compiled_activation_checkpointing_counts_tokens_once(scope):
    """The recompute in the backward does not count again, compiled as a whole or block by block (a compiled
    block recomputed by Python sees the mark of `recompute_marked`)."""
    from speedgpt.train.compile import compile_blocks

    cfg = moe_cfg(model_dim=32, vocab_size=64, attn_backend="sdpa")
    model = build_model(cfg, 16, grouped_runtime(cfg).replace(activation_checkpointing=True))
    x = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    if scope == "model":
        compiled_training_forward(model, x)
    else:
        torch._dynamo.reset()
        try:
            compile_blocks(model, backend="eager")
            model(x, x).backward()
        finally:
            torch._dynamo.reset()
    assert [b.mlp.load.sum().item() for b in model.blocks[1:]] == [16 * 2] * 2


def test_the_compiled_expert_loop_does_not_recompile_for_other_routings():
    """The loop path (CPU) reads its per-expert counts on the host: traced, each count was a guard on its value
    and the next batch's routing recompiled. Left out of the graph, a new routing reuses the graphs."""
    from torch._dynamo.utils import counters

    moe = MoE(16, 64, experts=4, top_k=2, shared=1)
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(moe, backend="eager", dynamic=False)
    xs = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    counters.clear()
    try:
        graphs, loads = [], []
        for x in xs:
            compiled(x)
            graphs.append(counters["stats"]["unique_graphs"])
            loads.append(moe.load.clone())
    finally:
        torch._dynamo.reset()
    assert not torch.equal(loads[0], loads[1] - loads[0])  # (the two batches were routed differently)
    assert graphs[0] == graphs[1]
