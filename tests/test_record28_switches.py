"""The switches that make speedgpt compute record #28's training math (speedrun-r28 preset); each off
by default, where it leaves today's numbers unchanged."""

from __future__ import annotations


import pytest
import torch

from speedgpt.config import ModelConfig, OptimConfig, ScheduleConfig, load_preset
from speedgpt.optim.muon import NS_COEFFS, Muon, muon_lr_scale, newton_schulz
from speedgpt.optim.schedules import attention_windows


def record28_window_blocks(step: int, total: int) -> int:
    """Record #28's get_window_size_blocks, as written there (next_multiple_of_n(1728 * x, n=128) // 128)."""
    v = 1728 * (step / total)
    return next(x for x in range(128, int(v) + 1 + 128, 128) if x >= v) // 128


def test_window_rule_record28_is_the_records_schedule():
    s = ScheduleConfig(window_start=128, window_end=1792, window_block=128, window_rule="record28")
    for total in (1695, 300):
        for step in range(total + 1):
            blocks = record28_window_blocks(step, total)
            assert attention_windows(s, step, total) == (blocks * 128, max(1, blocks // 2) * 128)
    # by hand: step 0 -> 1 block (short 0 blocks in the record = the diagonal block = 1 block here);
    # step 848 of 1695: 1728 * 848 / 1695 = 864.5 tokens -> 896 = 7 blocks, short 3; the end: ceil(13.5) = 14
    assert attention_windows(s, 0, 1695) == (128, 128)
    assert attention_windows(s, 848, 1695) == (7 * 128, 3 * 128)
    assert attention_windows(s, 1695, 1695) == (1792, 896)


def test_window_rule_linear_is_unchanged():
    s = ScheduleConfig(window_start=128, window_end=1792, window_block=128)
    assert s.window_rule == "linear"
    assert attention_windows(s, 1, 1695) == (128, 128)  # round(1 + 13/1695) = 1 block
    assert attention_windows(s, 848, 1695) == (8 * 128, 4 * 128)  # round(1 + 13 * 848 / 1695) = round(7.50)


def test_muon_shape_factor_on_the_records_layout():
    assert muon_lr_scale(torch.Size([3072, 768])) == 2.0  # this model's MLP input weight
    assert muon_lr_scale(torch.Size([3072, 768]), transposed=True) == 1.0  # the record's (768, 3072)
    assert muon_lr_scale(torch.Size([768, 3072])) == 1.0
    assert muon_lr_scale(torch.Size([3, 768, 768]), transposed=True) == 1.0


@pytest.mark.parametrize("transposed, factor", [(False, 2.0), (True, 1.0)])
def test_muon_step_size_follows_the_groups_layout(transposed, factor):
    p = torch.nn.Parameter(torch.zeros(8, 2))
    opt = Muon([dict(params=[p], shape_transposed=transposed)], lr=0.1, momentum=0.0, nesterov=False)
    p.grad = torch.tensor([[1.0, 0.0], [0.0, 1.0]] + [[0.0, 0.0]] * 6)  # already orthogonal: NS keeps ~it
    opt.step()
    ortho = newton_schulz(p.grad)
    assert torch.allclose(p.detach(), -0.1 * factor * ortho)


def test_build_optimizers_puts_the_mlp_input_weights_in_the_transposed_group():
    from speedgpt.model.build import build_model
    from speedgpt.optim.build import build_optimizers

    cfg = ModelConfig(depth=2, model_dim=64, head_dim=16, value_embeds=1)
    model = build_model(cfg, 32, "cpu")
    default = build_optimizers(model, OptimConfig(), torch.device("cpu"), world_size=1).muon
    assert len(default.param_groups) == 1 and not default.param_groups[0]["shape_transposed"]
    muon = build_optimizers(model, OptimConfig(muon_shape_factor="record28"), torch.device("cpu"), world_size=1).muon
    flipped = [g for g in muon.param_groups if g["shape_transposed"]]
    assert [id(p) for p in flipped[0]["params"]] == [id(b.mlp.fc.weight) for b in model.blocks]
    assert sum(len(g["params"]) for g in muon.param_groups) == len(default.param_groups[0]["params"])


def ns_by_hand(G: torch.Tensor, fused: bool) -> torch.Tensor:
    """Five Newton-Schulz iterations on a wide fp32 matrix, written out."""
    a, b, c = NS_COEFFS
    X = G / (G.norm() + 1e-7)
    for _ in range(5):
        A = X @ X.T
        if fused:
            X = torch.addmm(X, torch.addmm(A, A, A, beta=b, alpha=c), X, beta=a)
        else:
            X = a * X + (b * A + c * (A @ A)) @ X
    return X


def test_fused_newton_schulz_is_addmm_and_off_is_unchanged():
    G = torch.randn(3, 16, 32, generator=torch.Generator().manual_seed(0))
    for fused in (False, True):
        out = newton_schulz(G, fused=fused, dtype=torch.float32)
        for i in range(3):
            assert torch.equal(out[i], ns_by_hand(G[i], fused)) or torch.allclose(out[i], ns_by_hand(G[i], fused),
                                                                                 atol=1e-6)
    tall = newton_schulz(G[0].T.contiguous(), fused=True, dtype=torch.float32)  # 2D and transposed
    assert torch.allclose(tall, ns_by_hand(G[0], True).T, atol=1e-6)


def test_fused_newton_schulz_in_bf16_is_closer_to_the_exact_iteration():
    """The reason for the switch: one rounding per line lands nearer the fp64 result than three."""
    G = torch.randn(8, 64, 256, generator=torch.Generator().manual_seed(1))
    exact = newton_schulz(G.double(), dtype=torch.float64)
    err = {f: (newton_schulz(G, fused=f, dtype=torch.bfloat16).double() - exact).norm().item() for f in (False, True)}
    assert err[True] < err[False]


def test_fp8_head_train_only_evaluates_with_the_bf16_head(monkeypatch):
    import dataclasses

    import speedgpt.model.gpt as gpt
    from speedgpt.model.build import build_model
    from speedgpt.model.runtime import runtime_for

    cfg = ModelConfig(depth=2, model_dim=64, head_dim=16, value_embeds=1, fp8_head_train_only=True,
                      fp8_head_w_bound=0.875, logit_softcap=0.0)
    assert runtime_for(cfg, "cpu").fp8_w_bound == 0.875
    runtime = runtime_for(cfg, "cpu").replace(fp8_head=True)  # as on a GPU with FP8
    model = build_model(cfg, 32, runtime)
    calls = []

    def fake_fp8_linear(x, w, x_scale, w_scale, grad_scale, fp8_wgrad=False):
        calls.append(w_scale)
        return x @ w.T

    monkeypatch.setattr(gpt, "fp8_linear", fake_fp8_linear)
    x = torch.randint(0, 100, (1, 32))
    model.train()
    model(x, x)
    assert calls == [0.875 / 448]  # training: the FP8 head at the record's weight scale
    model.eval()
    model(x, x)
    assert len(calls) == 1  # evaluation: bf16 head
    always = build_model(dataclasses.replace(cfg, fp8_head_train_only=False), 32, runtime)
    always.eval()
    always(x, x)
    assert len(calls) == 2  # off: FP8 in evaluation too, as before


def test_speedrun_r28_is_record_28():
    cfg = load_preset("speedrun-r28")
    o, m, s = cfg.optim, cfg.model, cfg.schedule
    assert (o.embed_lr, o.value_embed_lr, o.head_lr, o.scalar_lr) == (0.008 * 75, 0.008 * 75, 0.008, 0.008 * 5)
    assert (o.adam_beta1, o.adam_beta2, o.adam_eps, o.adam_weight_decay) == (0.8, 0.95, 1e-10, 0.0)
    assert (o.muon_lr, o.muon_momentum_start, o.muon_momentum, o.muon_momentum_warmup_steps) == (0.05, 0.85, 0.95, 300)
    assert o.muon_shape_factor == "record28" and o.muon_ns_fused and o.muon_ortho == "newton_schulz"
    assert not (o.normuon or o.cautious_wd or o.muon_weight_decay or m.fp8_mlp or m.fp8_attn or m.fused_ce)
    assert m.fp8_head and m.fp8_head_train_only and m.fp8_head_w_bound == 448 * 2 ** -9
    assert m.fp8_head_fp8_wgrad
    assert m.attn_scale == 0.12 and m.attn_free_layers == [7] and m.window_pattern == "LSSSLSSLSSSL"
    assert m.attn_gate and m.attn_gate_dim == 768 // 64 and m.bf16_embeds and m.padded_vocab() == 50304
    assert s.window_rule == "record28" and (s.cooldown_frac, s.final_lr_frac) == (0.45, 0.1)
    assert (cfg.data.seq_len, cfg.data.val_seq_len, cfg.data.val_tokens) == (48 * 1024, 4 * 64 * 1024, 10485760)
    assert (cfg.train.steps, cfg.train.batch_tokens, cfg.train.val_every) == (1695, 8 * 48 * 1024, 125)
    assert cfg.data.packing == "record28"
    assert cfg.train.persistent_reductions_upto == 0  # speed tuning of later work: not part of the record


def test_speedrun_124m_has_the_fidelity_switches_on():
    cfg = load_preset("speedrun-124m")
    assert (cfg.optim.embed_lr, cfg.optim.value_embed_lr) == (0.6, 0.6)
    assert cfg.optim.muon_shape_factor == "record28" and cfg.optim.muon_ns_fused
    assert cfg.schedule.window_rule == "record28" and cfg.model.fp8_head_train_only
    assert cfg.model.fp8_head_w_bound == 0.875
    # its rows are the one place it leaves record #28 on purpose: mixed pieces won a paired A/B (wave 5)
    assert (cfg.data.packing, cfg.data.long_docs, cfg.data.max_doc_len) == ("greedy", "mix", 8192)


def test_base_config_keeps_every_switch_off():
    assert OptimConfig().muon_shape_factor == "rows_over_cols" and not OptimConfig().muon_ns_fused
    assert ScheduleConfig().window_rule == "linear"
    from speedgpt.config import DataConfig
    assert DataConfig().packing == "greedy"
    assert not ModelConfig().fp8_head_train_only and ModelConfig().fp8_head_w_bound == 24.0
    assert not ModelConfig().fp8_head_fp8_wgrad


def test_fp8_head_weight_gradient_as_the_records_fp8_matmul():
    from speedgpt.model.fp8_head import E4M3_MAX, fp8_linear

    g = torch.Generator().manual_seed(0)
    N, D, V = 64, 32, 48
    x = torch.nn.functional.rms_norm(torch.randn(N, D, generator=g), (D,)).bfloat16()
    w = torch.randn(V, D, generator=g) * 0.05
    gout = (torch.randn(N, V, generator=g) / N).bfloat16()
    xs, ws, gs = D ** 0.5 / E4M3_MAX, 0.875 / E4M3_MAX, 1 / (N * E4M3_MAX)
    grads = {}
    for on in (False, True):
        wp = w.clone().requires_grad_()
        fp8_linear(x, wp, xs, ws, gs, on).backward(gout)
        grads[on] = wp.grad
    # by hand: the record's x.div(x_s).to(e4m3) and grad.div(grad_s).to(e5m2) (divided in bf16, as there),
    # multiplied exactly in fp32, scaled back
    x8 = (x / xs).to(torch.float8_e4m3fn).float()
    g8 = (gout / gs).to(torch.float8_e5m2).float()
    by_hand = (g8.T @ x8) * (xs * gs)
    assert grads[True].dtype == torch.float32 and grads[True].shape == (V, D)
    assert torch.allclose(grads[True], by_hand, rtol=1e-5, atol=1e-6)
    assert torch.allclose(grads[False], (gout.T @ x).float())  # off: the bf16 matmul, as before
    assert not torch.allclose(grads[True], grads[False], rtol=1e-3, atol=0)
