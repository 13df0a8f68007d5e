"""The optimizer switches from the later speedrun records: Polar Express (optim.muon_ortho), NorMuon
(optim.normuon), cautious weight decay (optim.cautious_wd) and the weight-decay schedule
(optim.wd_schedule). Single-process math, checkpoints, config, the trainer's schedule, and
DistMuon on 2 gloo ranks against single-process Muon.
"""

import copy
from collections import defaultdict

import pytest
import torch

from speedgpt.config import ConfigError, apply_overrides, load_preset
from speedgpt.model.build import build_model
from speedgpt.optim.build import build_optimizers
from speedgpt.optim.muon import (DistMuon, Muon, muon_lr_scale, newton_schulz, normuon_normalize, orthogonalize,
                                 polar_express)
from speedgpt.optim.schedules import lr_multiplier, muon_weight_decay
from speedgpt.parallel.ddp import GradSync
from distkit import spawn_local
from speedgpt.parallel.dist import init_distributed
from speedgpt.plan import validate
from speedgpt.rundir.checkpoint import load_checkpoint, save_checkpoint
from test_optim import conditioned  # singular values log-spaced over [1/cond, 1]

pytestmark = pytest.mark.usefixtures("one_thread")


def params_and_grads(shapes, seed=0, steps=3):
    g = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]
    return init, grads


def run(opt_factory, init, grads):
    params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = opt_factory(params)
    for step_grads in grads:
        for p, gr in zip(params, step_grads):
            p.grad = gr.clone()
        opt.step()
    return params, opt


SHAPES = [(32, 96), (96, 32), (3, 32, 32), (32, 32), (48, 16), (5, 7)]


# ------------------------------------------------------------------------------------------------
# Switches off: the exact old arithmetic.

class _LegacyMuon(torch.optim.Optimizer):
    """Muon.step and newton_schulz as they were before the switches (commit 37ffcbe), verbatim in
    their arithmetic: the reference for 'all switches off changes nothing'."""

    def __init__(self, params, lr, momentum, nesterov=True, ns_steps=5, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                                      weight_decay=weight_decay))

    @staticmethod
    def newton_schulz(G, steps=5, eps=1e-7):
        a, b, c = (3.4445, -4.7750, 2.0315)
        X = G.to(torch.float32)
        transposed = G.size(-2) > G.size(-1)
        if transposed:
            X = X.mT
        X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
        for _ in range(steps):
            A = X @ X.mT
            B = b * A + c * (A @ A)
            X = a * X + B @ X
        if transposed:
            X = X.mT
        return X

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            by_shape = defaultdict(list)
            for p in group["params"]:
                m, n = p.shape[-2:]
                by_shape[(min(m, n), max(m, n), p.dtype, p.device)].append(p)
            for params in by_shape.values():
                dirs = []
                for p in params:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p.grad)
                    buf = state["momentum_buffer"]
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    dirs.append(p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf)
                wide = [d.reshape(-1, *d.shape[-2:]) for d in dirs]
                wide = [w.mT if w.size(-2) > w.size(-1) else w for w in wide]
                ortho = self.newton_schulz(torch.cat(wide), steps=group["ns_steps"])
                for p, d, chunk in zip(params, dirs, ortho.split([w.size(0) for w in wide])):
                    chunk = chunk.mT if d.size(-2) > d.size(-1) else chunk
                    lr = group["lr"]
                    if group["weight_decay"]:
                        p.mul_(1 - lr * group["weight_decay"])
                    p.add_(chunk.reshape(p.shape).to(p.dtype), alpha=-lr * muon_lr_scale(p.shape))


@pytest.mark.parametrize("nesterov,wd", [(True, 0.1), (False, 0.0)])
def test_switches_off_is_bitwise_the_old_muon(nesterov, wd):
    init, grads = params_and_grads(SHAPES, steps=4)
    new, new_opt = run(lambda ps: Muon(ps, lr=0.02, momentum=0.9, nesterov=nesterov, weight_decay=wd), init, grads)
    old, old_opt = run(lambda ps: _LegacyMuon(ps, lr=0.02, momentum=0.9, nesterov=nesterov, weight_decay=wd),
                       init, grads)
    for a, b in zip(new, old):
        assert torch.equal(a, b), a.shape
    for a, b in zip(new, old):
        assert new_opt.state[a].keys() == {"momentum_buffer"}  # no NorMuon state when it is off
        assert torch.equal(new_opt.state[a]["momentum_buffer"], old_opt.state[b]["momentum_buffer"])


def test_defaults_leave_every_switch_off_and_the_speedrun_preset_turns_the_ab_winners_on():
    from speedgpt.config import OptimConfig

    for o in (OptimConfig(), load_preset("tiny-cpu").optim):
        assert (o.muon_ortho, o.normuon, o.cautious_wd, o.wd_schedule) == ("newton_schulz", False, False, "constant")
    o = load_preset("speedrun-124m").optim  # chosen by the H100 A/B in docs/benchmarks.md
    assert (o.muon_ortho, o.normuon, o.cautious_wd, o.wd_schedule, o.muon_weight_decay) == \
        ("polar_express", True, True, "lr", 0.036)
    model = build_model(load_preset("tiny-cpu").model, 32, "cpu")
    muon = build_optimizers(model, load_preset("tiny-cpu").optim, torch.device("cpu")).muon
    g = muon.param_groups[0]
    assert (g["ortho"], g["normuon"], g["cautious_wd"]) == ("newton_schulz", False, False)


# ------------------------------------------------------------------------------------------------
# Polar Express.

@pytest.mark.parametrize("shape,cond", [((64, 64), 100), ((128, 32), 0), ((32, 128), 0), ((3, 48, 16), 0),
                                        ((4, 96, 32), 20), ((256, 256), 30)])
def test_polar_express_lands_closer_to_one_than_newton_schulz(shape, cond):
    g = torch.Generator().manual_seed(0)
    G = conditioned(shape, cond, g) if cond else torch.randn(*shape, generator=g)
    pe = polar_express(G, steps=5, dtype=torch.float32)
    ns = newton_schulz(G, steps=5, dtype=torch.float32)
    assert pe.shape == G.shape
    err_pe = (torch.linalg.svdvals(pe) - 1).abs().max()
    err_ns = (torch.linalg.svdvals(ns) - 1).abs().max()
    # Measured: NS5 ends in ~[0.68, 1.20] (error ~0.32), Polar Express in ~[0.86, 1.14] (~0.14).
    assert err_pe < 0.15, err_pe
    assert err_ns > 0.25 and err_pe < 0.6 * err_ns, (err_pe, err_ns)
    # Orthogonal-ish: the Gram matrix is within (1.15^2 - 1) of the identity in spectral norm ...
    wide = pe if shape[-2] <= shape[-1] else pe.mT
    eye = torch.eye(wide.size(-2))
    assert torch.linalg.matrix_norm(wide @ wide.mT - eye, ord=2).max() < 1.15 ** 2 - 1
    # ... and it is G's polar factor U V^T up to that spread of singular values.
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    polar = U @ Vh
    cos = (pe * polar).sum((-2, -1)) / (pe.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert cos.min() > 0.99


def test_polar_express_applies_the_published_polynomials_to_the_singular_values():
    """The matrix iteration acts on each singular value of G / (1.02 ||G||_F + 1e-6) as the
    composition of the scalar quintics; first and last coefficient sets as published."""
    from speedgpt.optim.muon import POLAR_EXPRESS_COEFFS

    assert POLAR_EXPRESS_COEFFS[0] == (8.156554524902461, -22.48329292557795, 15.878769915207462)
    assert POLAR_EXPRESS_COEFFS[-1] == (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)
    g = torch.Generator().manual_seed(3)
    G = conditioned((40, 24), 50, g).double()
    x = torch.linalg.svdvals(G) / (1.02 * G.norm() + 1e-6)
    for a, b, c in POLAR_EXPRESS_COEFFS:
        x = a * x + b * x ** 3 + c * x ** 5
    out = polar_express(G, dtype=torch.float64)
    torch.testing.assert_close(torch.linalg.svdvals(out), x.sort(descending=True).values, atol=1e-9, rtol=0)


def test_polar_express_in_bf16_stays_in_range():
    g = torch.Generator().manual_seed(1)
    G = torch.randn(3, 96, 32, generator=g)
    sv = torch.linalg.svdvals(polar_express(G, dtype=torch.bfloat16).float())
    assert sv.min() > 0.8 and sv.max() < 1.2


def test_polar_express_is_tuned_for_five_steps_and_capped_there():
    g = torch.Generator().manual_seed(2)
    G = torch.randn(32, 64, generator=g)
    errs = [(torch.linalg.svdvals(polar_express(G, steps=k, dtype=torch.float32)) - 1).abs().max().item()
            for k in range(1, 6)]
    assert errs[-1] < 0.15 and errs[-1] < 0.3 * min(errs[:-1]), errs  # intermediate iterates overshoot
    with pytest.raises(ValueError, match="coefficients exist for 1..5"):
        polar_express(G, steps=6)


def test_muon_with_polar_express_steps_by_the_orthogonalized_momentum():
    init, grads = params_and_grads([(64, 16)], steps=1)
    (p,), _ = run(lambda ps: Muon(ps, lr=0.1, momentum=0.0, nesterov=False, ortho="polar_express"), init, grads)
    expected = init[0] - 0.1 * muon_lr_scale(p.shape) * polar_express(grads[0][0])
    torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=0)


def reference_update(opt, p, grad, group):
    """Muon's per-matrix math written out step by step, apart from the batched code it checks (momentum,
    Nesterov, orthogonalization, NorMuon; the decay and the step are apply_update's, per matrix anyway)."""
    state = opt.state[p]
    buf = state.setdefault("momentum_buffer", torch.zeros_like(grad))
    buf.lerp_(grad, 1 - group["momentum"])
    d = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
    u = orthogonalize(d, group["ortho"], group["ns_steps"], group["ns_fused"])
    if group["normuon"]:
        moment = state.setdefault("second_momentum_buffer", torch.zeros(*p.shape[:-1], 1))
        u = normuon_normalize(u, moment, group["normuon_beta2"])
    opt.apply_update(p, u, group)


@pytest.mark.parametrize("nesterov", [True, False])
def test_batched_step_equals_per_matrix_updates_with_every_switch(nesterov):
    """Muon.step batches same-shaped (incl. transposed) matrices: multi-tensor momentum, one orthogonalization,
    NorMuon on stacks of one shape. The result must be the per-matrix math with all switches on."""
    kw = dict(lr=0.02, momentum=0.9, nesterov=nesterov, weight_decay=0.5, ortho="polar_express", normuon=True,
              cautious_wd=True)
    init, grads = params_and_grads(SHAPES + [(32, 96), (3, 32, 32)])  # two of a shape: NorMuon's stacked path
    batched, _ = run(lambda ps: Muon(ps, **kw), init, grads)
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    opt = Muon(ref, **kw)
    with torch.no_grad():
        for step_grads in grads:
            for r, gr in zip(ref, step_grads):
                reference_update(opt, r, gr.clone(), opt.param_groups[0])
    for a, b in zip(batched, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=str(a.shape))


# ------------------------------------------------------------------------------------------------
# NorMuon.

def row_rms(x):
    return x.square().mean(-1).sqrt()


def test_normuon_equalizes_rows_and_keeps_the_update_norm():
    """A tall matrix: its orthogonalized update U V^T has rows of very different norms (leverage
    scores). After one NorMuon step every row moves by the same RMS, and the whole update has the
    same Frobenius norm as plain Muon's."""
    init, grads = params_and_grads([(128, 32)], steps=1)
    kw = dict(lr=0.1, momentum=0.0, nesterov=False)
    (plain,), _ = run(lambda ps: Muon(ps, **kw), init, grads)
    (nor,), opt = run(lambda ps: Muon(ps, normuon=True, **kw), init, grads)
    d_plain, d_nor = (plain - init[0]).detach(), (nor - init[0]).detach()
    spread = lambda d: (row_rms(d).max() / row_rms(d).min()).item()  # noqa: E731
    assert spread(d_plain) > 1.5  # the imbalance NorMuon removes (so this test can fail)
    assert spread(d_nor) < 1.001
    torch.testing.assert_close(d_nor.norm(), d_plain.norm(), rtol=1e-5, atol=0)
    buf = opt.state[nor]["second_momentum_buffer"]
    assert buf.shape == (128, 1) and buf.dtype == torch.float32


def test_normuon_second_moment_is_a_row_ema_of_the_orthogonalized_update():
    """Pins the axis (rows = output units), the EMA and the rescale on a batched 3-D parameter."""
    beta2 = 0.8
    init, grads = params_and_grads([(2, 24, 40)], steps=2)
    (p,), opt = run(lambda ps: Muon(ps, lr=0.1, momentum=0.0, nesterov=False, normuon=True, normuon_beta2=beta2),
                    init, grads)
    o1, o2 = (newton_schulz(g[0]) for g in grads)
    ms1, ms2 = o1.square().mean(-1, keepdim=True), o2.square().mean(-1, keepdim=True)
    ema = (1 - beta2) * beta2 * ms1 + (1 - beta2) * ms2
    buf = opt.state[p]["second_momentum_buffer"]
    assert buf.shape == (2, 24, 1)
    torch.testing.assert_close(buf, ema, rtol=1e-5, atol=0)
    # The second step's update, rebuilt by hand from that EMA.
    v = o2 / ema.sqrt()
    v = v * o2.norm(dim=(-2, -1), keepdim=True) / v.norm(dim=(-2, -1), keepdim=True)
    (p1,), _ = run(lambda ps: Muon(ps, lr=0.1, momentum=0.0, nesterov=False, normuon=True, normuon_beta2=beta2),
                   init, grads[:1])
    torch.testing.assert_close(p.detach(), p1.detach() - 0.1 * v, atol=1e-6, rtol=0)


def test_normuon_handles_a_zero_update():
    buf = torch.zeros(4, 1)
    out = normuon_normalize(torch.zeros(4, 8), buf, 0.95)
    assert torch.equal(out, torch.zeros(4, 8)) and torch.equal(buf, torch.zeros(4, 1))


def test_normuon_state_round_trips_through_state_dict_and_checkpoints(tmp_path):
    kw = dict(lr=0.02, momentum=0.9, normuon=True, ortho="polar_express", cautious_wd=True, weight_decay=0.5)
    init, grads = params_and_grads(SHAPES, steps=4)
    # Reference: four uninterrupted steps.
    ref, _ = run(lambda ps: Muon(ps, **kw), init, grads)
    # Two steps, a checkpoint through the trainer's save/load functions, a fresh optimizer, two more.
    half, opt = run(lambda ps: Muon(ps, **kw), init, grads[:2])
    sd = opt.state_dict()
    assert all("second_momentum_buffer" in s for s in sd["state"].values())
    save_checkpoint(tmp_path, 2, {}, [sd], {"tokens": 0})
    _, (loaded_sd,), _ = load_checkpoint(tmp_path / "step_000002")
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in half]
    opt2 = Muon(resumed, **kw)
    opt2.load_state_dict(loaded_sd)
    for a, b in zip(half, resumed):
        for k in ("momentum_buffer", "second_momentum_buffer"):
            assert torch.equal(opt.state[a][k], opt2.state[b][k]), k
    for step_grads in grads[2:]:
        for p, gr in zip(resumed, step_grads):
            p.grad = gr.clone()
        opt2.step()
    for a, b in zip(ref, resumed):
        assert torch.equal(a, b), a.shape  # exact resume


def test_load_keeps_this_runs_switches_and_fp32_second_moments():
    """A checkpoint written without NorMuon loads into a NorMuon run and NorMuon stays on (the
    container takes only per-parameter state from a checkpoint, never settings); bf16 parameters
    keep their second moments in fp32 across a load."""
    from speedgpt.optim.container import Optimizers
    from speedgpt.parallel.ddp import NoSync

    p = torch.nn.Parameter(torch.randn(16, 8).bfloat16())
    e = torch.nn.Parameter(torch.randn(4, 8))

    def container(**muon_kw):
        return Optimizers(torch.optim.AdamW([e], lr=0.01), Muon([p], lr=0.02, **muon_kw),
                          {id(p): "w", id(e): "e"}, NoSync())

    old = container()
    p.grad, e.grad = torch.randn(16, 8).bfloat16(), torch.randn(4, 8)
    old.step()
    sd = old.state_dict()
    assert set(sd) == {"adam", "muon"} and set(sd["muon"]) == {"w"} and set(sd["adam"]) == {"e"}
    new = container(normuon=True, ortho="polar_express")
    new.load_state_dict(sd)
    g = new.muon.param_groups[0]
    assert g["normuon"] is True and g["ortho"] == "polar_express"
    new.step()
    buf = new.muon.state[p]["second_momentum_buffer"]
    assert buf.dtype == torch.float32
    again = container(normuon=True)
    again.load_state_dict(new.state_dict())
    assert again.muon.state[p]["second_momentum_buffer"].dtype == torch.float32
    assert torch.equal(again.muon.state[p]["second_momentum_buffer"], buf)


# ------------------------------------------------------------------------------------------------
# Cautious weight decay and its schedule.

def test_cautious_weight_decay_by_hand():
    """lr 0.1, wd 0.5 (lr*wd = 0.05), a 2x3 matrix (muon_lr_scale 1). Decay only where update * p >= 0
    (the paper's indicator): (0,0) and (1,0) agree, (1,2) has a zero update; the rest disagree."""
    p = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, 2.0]])
    u = torch.tensor([[0.5, 0.5, -0.5], [-0.5, -0.5, 0.0]])
    group = dict(lr=0.1, weight_decay=0.5, cautious_wd=True)
    cautious = p.clone()
    Muon([torch.nn.Parameter(p.clone())]).apply_update(cautious, u, group)
    expected = torch.tensor([[1 - 0.05 - 0.05, -2 - 0.05, 3 + 0.05],
                             [-4 + 0.2 + 0.05, 5 + 0.05, 2 - 0.1]])
    torch.testing.assert_close(cautious, expected, atol=1e-6, rtol=0)
    plain = p.clone()
    Muon([torch.nn.Parameter(p.clone())]).apply_update(plain, u, dict(group, cautious_wd=False))
    torch.testing.assert_close(plain, p * 0.95 - 0.1 * u, atol=1e-6, rtol=0)  # decays every coordinate


def test_cautious_weight_decay_in_a_full_step():
    init, grads = params_and_grads([(48, 16)], steps=1)
    lr, wd = 0.1, 0.5
    (p,), _ = run(lambda ps: Muon(ps, lr=lr, momentum=0.0, nesterov=False, weight_decay=wd, cautious_wd=True),
                  init, grads)
    u = newton_schulz(grads[0][0])
    x = init[0]
    expected = x - lr * wd * (u * x >= 0) * x - lr * muon_lr_scale(x.shape) * u
    torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=0)
    assert 0.3 < (u * x >= 0).float().mean() < 0.7  # both branches of the mask are exercised


def test_weight_decay_schedule_follows_the_lr_multiplier():
    assert muon_weight_decay(0.036, "constant", 0.3) == 0.036
    assert muon_weight_decay(0.036, "lr", 0.3) == pytest.approx(0.0108)
    with pytest.raises(ValueError, match="unknown weight-decay schedule"):
        muon_weight_decay(0.1, "cosine", 1.0)


@pytest.mark.parametrize("schedule", ["constant", "lr"])
def test_trainer_sets_the_scheduled_weight_decay_each_step(schedule):
    from speedgpt.train.loop import Trainer
    from speedgpt.train.step_schedule import apply_hyperparameters

    cfg = apply_overrides(load_preset("tiny-cpu"), [
        "--train.device=cpu", "--train.steps=100", "--optim.muon_weight_decay=0.05",
        f"--optim.wd_schedule={schedule}", "--optim.cautious_wd=true"])
    trainer = Trainer(cfg, quiet=True)
    model = build_model(cfg.model, cfg.data.seq_len, "cpu")
    trainer.optimizers = build_optimizers(model, cfg.optim, torch.device("cpu"))
    for step in (0, 54, 80, 99):
        apply_hyperparameters(trainer.optimizers, trainer.plan, step)
        mult = lr_multiplier(cfg.schedule, step, 100)
        group = trainer.optimizers.muon.param_groups[0]
        assert group["cautious_wd"] is True
        assert group["lr"] == pytest.approx(cfg.optim.muon_lr * mult)
        assert group["weight_decay"] == pytest.approx(0.05 * (mult if schedule == "lr" else 1.0))
    assert mult < 0.2  # the cooldown was reached: "lr" really decayed


def test_training_with_every_switch_resumes_exactly(tmp_path):
    """The whole path: config -> build -> trainer schedule -> checkpoint (NorMuon buffers, scheduled
    decay) -> resume. Steps 3-4 of a resumed run repeat the uninterrupted run's losses exactly."""
    import shutil

    import numpy as np

    from speedgpt.data.shards import write_shard
    from speedgpt.train.loop import train

    rng = np.random.default_rng(0)
    toks = []
    while len(toks) < 12_000:  # BOS-led "documents" counting mod 64 (as in test_parallel_train.py)
        start, n = int(rng.integers(0, 64)), int(rng.integers(4, 60))
        toks += [50256] + [(start + i) % 64 for i in range(n)]
    write_shard(tmp_path / "train_000000.bin", toks[:10_000])
    write_shard(tmp_path / "val_000000.bin", toks[10_000:])
    cfg = apply_overrides(load_preset("tiny-cpu"), [
        "--model.depth=2", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
        "--data.seq_len=32", f"--data.train_files={tmp_path}/train_*.bin", f"--data.val_files={tmp_path}/val_*.bin",
        "--data.val_tokens=512", "--train.batch_tokens=256", "--train.steps=4", "--train.checkpoint_every=2",
        "--train.keep_checkpoints=0", "--train.val_every=0", "--train.log_every=1", "--train.device=cpu",
        "--run.sample_tokens=0", "--run.report=false", "--schedule.window_start=32", "--schedule.window_end=32",
        "--schedule.window_block=16", "--optim.muon_ortho=polar_express", "--optim.normuon=true",
        "--optim.cautious_wd=true", "--optim.muon_weight_decay=0.05", "--optim.wd_schedule=lr"])
    full = train(cfg, run_dir=tmp_path / "full", quiet=True)
    optim_state = torch.load(tmp_path / "full/checkpoints/step_000002/optim.pt")["muon"]
    assert optim_state and all("second_momentum_buffer" in st for st in optim_state.values())
    shutil.copytree(tmp_path / "full", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed/checkpoints/step_000004")
    resumed = train(cfg, run_dir=tmp_path / "resumed", resume=True, quiet=True)
    assert resumed.train_losses == full.train_losses[2:]
    assert full.train_losses[-1] < full.train_losses[0]


# ------------------------------------------------------------------------------------------------
# Config.

@pytest.mark.parametrize("override,fragment", [
    (["--optim.muon_ortho=svd"], "optim.muon_ortho='svd' must be newton_schulz or polar_express"),
    (["--optim.muon_ortho=polar_express", "--optim.muon_ns_steps=6"], "at most 5 iterations"),
    (["--optim.muon_ns_steps=0"], "optim.muon_ns_steps=0 must be at least 1"),
    (["--optim.normuon_beta2=1.0"], r"optim.normuon_beta2=1.0 must lie in \(0, 1\)"),
    (["--optim.normuon_beta2=0"], r"optim.normuon_beta2=0.0 must lie in \(0, 1\)"),
    (["--optim.wd_schedule=cosine"], "optim.wd_schedule='cosine' must be constant, lr or linear"),
    (["--optim.cautious_wd=true"], "optim.cautious_wd=True does nothing with optim.muon_weight_decay=0"),
    (["--optim.wd_schedule=lr"], "optim.wd_schedule='lr' does nothing with optim.muon_weight_decay=0"),
    (["--optim.muon_weight_decay=-0.1"], "optim.muon_weight_decay=-0.1 must be >= 0"),
])
def test_optim_validation_errors(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        validate(apply_overrides(load_preset("tiny-cpu"), override))


def test_build_passes_every_switch():
    cfg = apply_overrides(load_preset("tiny-cpu"), [
        "--optim.muon_ortho=polar_express", "--optim.normuon=true", "--optim.normuon_beta2=0.9",
        "--optim.cautious_wd=true", "--optim.muon_weight_decay=0.04", "--optim.wd_schedule=lr"])
    validate(cfg)
    model = build_model(cfg.model, 32, "cpu")
    muon = build_optimizers(model, cfg.optim, torch.device("cpu")).muon
    g = muon.param_groups[0]
    assert (g["ortho"], g["normuon"], g["normuon_beta2"], g["cautious_wd"], g["weight_decay"]) == \
        ("polar_express", True, 0.9, True, 0.04)
    with pytest.raises(ValueError, match="unknown orthogonalization"):
        orthogonalize(torch.randn(4, 4), "svd")


# ------------------------------------------------------------------------------------------------
# DistMuon on 2 gloo ranks == single-process Muon, per switch; state across world sizes.

DIST_SHAPES = [(32, 16), (32, 16), (32, 16), (16, 48), (2, 24, 8)]  # 3 alike: a padded chunk on 2 ranks
DIST_CONFIGS = {
    "polar_express": dict(ortho="polar_express"),
    "normuon": dict(normuon=True, normuon_beta2=0.9),
    "cautious_wd": dict(cautious_wd=True, weight_decay=0.5),
    "all": dict(ortho="polar_express", normuon=True, cautious_wd=True, weight_decay=0.5),
    "no_nesterov": dict(nesterov=False, normuon=True),
}


def _dist_grads(world, steps, seed):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(world, *s, generator=g) for s in DIST_SHAPES] for _ in range(steps)]


def _dist_step(opt, ref_opt, ws, ref, rank, step_grads):
    for w, r, G in zip(ws, ref, step_grads):
        w.grad = G[rank].clone()
        r.grad = G.mean(0)
    opt.step()
    ref_opt.step()


def _batching_check(rank, world):
    """A rank's matrices of one shape, transposed ones included, are orthogonalized in one batch and
    all-gathered in one collective per step (per chunk, each rank's host issued ~50 small launches a
    matrix; wave 9), and the result is Muon's."""
    # 2 + 1 + 1 chunks of one batch key, the last of 3-D matrices (two each): 5 matrices a rank in one batch, and
    # one all-gather of chunks of two sizes
    shapes = [(32, 16)] * 2 * world + [(16, 32)] * world + [(2, 16, 32)] * world
    for kw in ({}, dict(nesterov=False, normuon=True, cautious_wd=True, weight_decay=0.5)):
        _batching_case(rank, world, shapes, kw)


def _batching_case(rank, world, shapes, kw):
    import speedgpt.optim.muon as muon_mod

    g = torch.Generator().manual_seed(7)
    init = [torch.randn(s, generator=g) for s in shapes]
    ws = [torch.nn.Parameter(t.clone()) for t in init]
    ref = [torch.nn.Parameter(t.clone()) for t in init]
    sync = GradSync(world, rank, torch.device("cpu"))
    opt, ref_opt = DistMuon(ws, sync, lr=0.02, **kw), Muon(ref, lr=0.02, **kw)
    batches, gathers = [], []
    real, real_gather = muon_mod.orthogonalize, muon_mod.all_gather

    def spy(G, *args, **kwargs):
        batches.append(G.shape[0])
        return real(G, *args, **kwargs)

    def spy_gather(out, inp, *args, **kwargs):
        gathers.append(inp.numel())
        return real_gather(out, inp, *args, **kwargs)

    muon_mod.orthogonalize, muon_mod.all_gather = spy, spy_gather
    try:
        for step in range(2):
            grads = [torch.randn(world, *s, generator=g) for s in shapes]
            for w, r, G in zip(ws, ref, grads):
                w.grad, r.grad = G[rank].clone(), G.mean(0)
            batches.clear()
            gathers.clear()
            opt.step()
            assert batches == [5], f"rank {rank}: orthogonalize called with batches {batches}, want one of 5"
            want = 3 * 32 * 16 + 2 * 16 * 32
            assert gathers == [want], f"rank {rank}: all-gathers of {gathers} elements, want one of {want}"
            ref_opt.step()
            for w, r in zip(ws, ref):
                torch.testing.assert_close(w, r, atol=2e-5, rtol=0)
    finally:
        muon_mod.orthogonalize, muon_mod.all_gather = real, real_gather
    sync.remove_hooks()


def _switches_worker(rank, world, out):
    init_distributed("cpu")
    cpu = torch.device("cpu")
    init, _ = params_and_grads(DIST_SHAPES, steps=0)
    for seed, (name, kw) in enumerate(DIST_CONFIGS.items()):
        ws = [torch.nn.Parameter(t.clone()) for t in init]
        ref = [torch.nn.Parameter(t.clone()) for t in init]
        sync = GradSync(world, rank, cpu)
        opt = DistMuon(ws, sync, lr=0.02, momentum=0.9, **kw)
        ref_opt = Muon(ref, lr=0.02, momentum=0.9, **kw)
        grads = _dist_grads(world, 4, seed=seed)
        for step_grads in grads[:3]:
            _dist_step(opt, ref_opt, ws, ref, rank, step_grads)
            for w, r in zip(ws, ref):
                torch.testing.assert_close(w, r, atol=2e-5, rtol=0, msg=lambda m: f"{name}: {m}")
        if kw.get("normuon"):
            # Sharded state: each rank keeps the second moments of the matrices it owns, and only those.
            owned = {id(ps[rank]) for _, ps, _ in opt._chunks if rank < len(ps)}
            have = {id(p) for p in ws if "second_momentum_buffer" in opt.state.get(p, {})}
            assert have == owned and owned
        # The full state (collective) equals the single-process one, NorMuon buffers included.
        full = opt.state_dict()
        ref_sd = ref_opt.state_dict()
        assert full["state"].keys() == ref_sd["state"].keys()
        for i, st in ref_sd["state"].items():
            assert full["state"][i].keys() == st.keys()
            for k, v in st.items():
                torch.testing.assert_close(full["state"][i][k], v, atol=2e-5, rtol=1e-4, msg=f"{name} {i}/{k}")
        if name == "all" and rank == 0:  # for the 2 -> 1 load in the parent process
            torch.save({"params": [w.detach().clone() for w in ws], "state": full,
                        "next_grads": [G.mean(0) for G in grads[3]]}, f"{out}/full.pt")
        # 1 -> 2: the single-process state loads into DistMuon (re-sharded) and both step on alike.
        opt.load_state_dict(copy.deepcopy(ref_sd))
        with torch.no_grad():
            for w, r in zip(ws, ref):
                w.copy_(r)
        _dist_step(opt, ref_opt, ws, ref, rank, grads[3])
        for w, r in zip(ws, ref):
            torch.testing.assert_close(w, r, atol=2e-5, rtol=0, msg=lambda m: f"{name} after 1->2 load: {m}")
        if name == "all" and rank == 0:
            torch.save({"params": [r.detach().clone() for r in ref]}, f"{out}/ref_after.pt")
        sync.remove_hooks()
    _batching_check(rank, world)
    # build_optimizers hands the switches to DistMuon too.
    cfg = apply_overrides(load_preset("tiny-cpu"), [
        "--model.depth=2", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
        "--optim.muon_ortho=polar_express", "--optim.normuon=true", "--optim.cautious_wd=true",
        "--optim.muon_weight_decay=0.04"])
    muon = build_optimizers(build_model(cfg.model, 32, "cpu"), cfg.optim, cpu).muon
    assert isinstance(muon, DistMuon)
    g = muon.param_groups[0]
    assert (g["ortho"], g["normuon"], g["cautious_wd"], g["weight_decay"]) == ("polar_express", True, True, 0.04)
    muon.grad_sync.remove_hooks()
    torch.distributed.destroy_process_group()


def test_dist_muon_two_ranks_match_muon_per_switch_and_state_moves_between_world_sizes(tmp_path):
    spawn_local(_switches_worker, 2, str(tmp_path))
    # 2 -> 1: the full state written on 2 ranks (NorMuon buffers included) resumes single-process Muon
    # exactly where the distributed reference went.
    saved = torch.load(tmp_path / "full.pt")
    params = [torch.nn.Parameter(p.clone()) for p in saved["params"]]
    opt = Muon(params, lr=0.02, momentum=0.9, **DIST_CONFIGS["all"])
    opt.load_state_dict(saved["state"])
    assert all("second_momentum_buffer" in opt.state[p] for p in params)
    for p, g in zip(params, saved["next_grads"]):
        p.grad = g
    opt.step()
    after = torch.load(tmp_path / "ref_after.pt")["params"]
    for p, r in zip(params, after):
        torch.testing.assert_close(p.detach(), r, atol=2e-5, rtol=0)


def test_container_reads_checkpoints_written_before_it():
    """optim.pt used to hold [adam state_dict, muon state_dict] with state by position; it still loads."""
    cfg = load_preset("tiny-cpu")
    model = build_model(cfg.model, 32, "cpu")
    opts = build_optimizers(model, cfg.optim, torch.device("cpu"))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opts.step()
    legacy = [opts.adam.state_dict(), opts.muon.state_dict()]
    fresh = build_optimizers(model, cfg.optim, torch.device("cpu"))
    fresh.load_state_dict(copy.deepcopy(legacy))
    named, again = opts.state_dict(), fresh.state_dict()
    assert named.keys() == again.keys() and named["muon"].keys() == again["muon"].keys()
    for key in named:
        for name, st in named[key].items():
            for k, v in st.items():
                assert torch.equal(again[key][name][k], v), (key, name, k)
