import pytest
import torch

from speedgpt.config import ScheduleConfig
from speedgpt.optim.muon import Muon, muon_lr_scale, newton_schulz
from speedgpt.optim.schedules import attention_windows, constant_cooldown, lr_multiplier, muon_momentum, warmup_cosine


def conditioned(shape, cond, g):
    """A matrix with singular values log-spaced over [1/cond, 1]: like a gradient, unlike a random square
    Gaussian, whose smallest singular value tends to zero (five iterations cannot lift such a direction)."""
    m, n = shape[-2:]
    k = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(*shape[:-2], m, k, generator=g))
    V, _ = torch.linalg.qr(torch.randn(*shape[:-2], n, k, generator=g))
    s = torch.logspace(0, -torch.log10(torch.tensor(float(cond))).item(), k)
    return U @ torch.diag_embed(s.expand(*shape[:-2], k)) @ V.mT


@pytest.mark.parametrize("shape,cond", [((64, 64), 100), ((128, 32), 0), ((32, 128), 0), ((3, 48, 16), 0),
                                        ((256, 256), 30)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_singular_values_near_one(shape, cond, dtype):
    g = torch.Generator().manual_seed(0)
    # cond 0: a random Gaussian of that (rectangular) shape, which is well conditioned
    G = conditioned(shape, cond, g) if cond else torch.randn(*shape, generator=g)
    X = newton_schulz(G, steps=5, dtype=dtype).float()
    assert X.shape == G.shape
    sv = torch.linalg.svdvals(X)
    assert sv.min() > 0.5 and sv.max() < 1.5, (sv.min(), sv.max())
    # orthogonalization keeps the singular vectors: X ~ U V^T of G
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    cos = (X * (U @ Vh)).sum() / (X.norm() * (U @ Vh).norm())
    assert cos > 0.9


def test_newton_schulz_is_not_identity_on_ill_conditioned_input():
    G = torch.diag(torch.tensor([100.0, 1.0, 0.01, 10.0]))
    sv = torch.linalg.svdvals(newton_schulz(G, dtype=torch.float32))
    assert sv.max() / sv.min() < 50  # condition number 10^4 squeezed by orders of magnitude


def test_muon_step_moves_each_matrix_by_lr_times_scale():
    p = torch.nn.Parameter(torch.zeros(64, 16))
    opt = Muon([p], lr=0.1, momentum=0.0, nesterov=False)
    p.grad = torch.randn(64, 16)
    opt.step()
    sv = torch.linalg.svdvals(p.detach() / (0.1 * muon_lr_scale(p.shape)))
    assert muon_lr_scale(p.shape) == 2.0
    assert sv.min() > 0.5 and sv.max() < 1.5


def test_constant_cooldown_shape():
    f = lambda s: constant_cooldown(s, 100, cooldown_frac=0.4, final_frac=0.1)  # noqa: E731
    assert f(0) == 1.0 and f(59) == 1.0
    assert f(80) == pytest.approx(0.5 + 0.5 * 0.1)
    assert f(100) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(100))


def test_warmup_cosine_shape():
    f = lambda s: warmup_cosine(s, 100, warmup_frac=0.1, final_frac=0.0)  # noqa: E731
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.5, abs=1e-9)
    assert f(100) == pytest.approx(0.0, abs=1e-9)


def test_constant_cooldown_with_warmup_is_wsd():
    cfg = ScheduleConfig(kind="constant_cooldown", warmup_frac=0.1, cooldown_frac=0.2, final_lr_frac=0.0)
    vals = [lr_multiplier(cfg, s, 100) for s in range(101)]
    assert vals[0] == pytest.approx(0.1) and vals[9] == pytest.approx(1.0)
    assert all(v == 1.0 for v in vals[10:80])
    assert vals[90] == pytest.approx(0.5) and vals[100] == pytest.approx(0.0)


def test_muon_momentum_warmup():
    assert muon_momentum(0, 0.85, 0.95, 300) == pytest.approx(0.85)
    assert muon_momentum(150, 0.85, 0.95, 300) == pytest.approx(0.90)
    assert muon_momentum(1000, 0.85, 0.95, 300) == pytest.approx(0.95)


def test_attention_windows_grow_in_blocks():
    cfg = ScheduleConfig(window_start=128, window_end=1792, window_block=128, short_window_frac=0.5)
    seq = [attention_windows(cfg, s, 1000) for s in range(0, 1001, 50)]
    assert seq[0] == (128, 128) and seq[-1] == (1792, 896)
    longs = [w[0] for w in seq]
    assert longs == sorted(longs) and all(w % 128 == 0 for w in longs)
    assert all(s <= l and s % 128 == 0 for l, s in seq)


def test_batched_muon_step_equals_per_matrix_updates():
    """Muon.step batches same-shaped (incl. transposed) matrices; the result must equal the
    one-matrix-at-a-time update."""
    g = torch.Generator().manual_seed(0)
    shapes = [(32, 96), (96, 32), (3, 32, 32), (32, 32), (5, 7)]
    params = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, ref_opt = Muon(params, lr=0.02, momentum=0.9), Muon(ref, lr=0.02, momentum=0.9)
    for _ in range(3):
        for p, r in zip(params, ref):
            p.grad = torch.randn(p.shape, generator=g)
            r.grad = p.grad.clone()
        opt.step()
        with torch.no_grad():
            for r in ref:
                (update,) = ref_opt.updates_for([r], [r.grad], ref_opt.param_groups[0])  # a batch of one
                ref_opt.apply_update(r, update, ref_opt.param_groups[0])
    for p, r in zip(params, ref):
        assert torch.allclose(p, r, atol=1e-5), p.shape


def test_adamw_kind_is_one_adamw_decaying_matrices_only():
    from speedgpt.config import OptimConfig
    from speedgpt.config import ModelConfig
    from speedgpt.model.build import build_model
    from speedgpt.optim.build import build_optimizers

    model = build_model(ModelConfig(depth=2, model_dim=64, head_dim=16, value_embeds=1, vocab_size=256), 32)
    opts = build_optimizers(model, OptimConfig(kind="adamw", adamw_lr=1e-3, adamw_weight_decay=0.1),
                            torch.device("cpu"), world_size=1)
    assert opts.muon is None and list(opts.members()) == ["adam"]
    decay, rest = opts.adam.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert {names[id(p)] for p in decay["params"]} == {n for n, p in model.named_parameters()
                                                        if n.startswith("blocks.") or n == "lm_head.weight"}
    assert all(g["lr"] == 1e-3 for g in (decay, rest))
    x = torch.randint(0, 256, (2, 32))
    model(x, x).backward()
    opts.step()  # one step of the whole model, state saved by name
    assert set(opts.state_dict()) == {"adam"}
