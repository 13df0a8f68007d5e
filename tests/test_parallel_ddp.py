"""Overlapped gradient reduction and the sharded optimizers, on CPU with gloo.

The distributed checks compare against a single-process reference computed inside each worker
on the concatenated batch (no communication), so any difference is the distributed machinery's.
"""

import copy

import pytest
import torch

from speedgpt.config import ConfigError, apply_overrides, load_preset, micro_batch_rows
from speedgpt.model.build import build_model
from speedgpt.optim.adam import DistAdam
from speedgpt.optim.build import build_optimizers
from speedgpt.optim.muon import DistMuon, Muon
from speedgpt.parallel.ddp import GradSync, NoSync, clip_grad_norm_, grad_sync_of
from distkit import spawn_local
from speedgpt.parallel.dist import grad_comm_dtype, init_distributed, reduce_scatter, teardown

TINY = ["--model.depth=2", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
        "--model.vocab_size=512",  # batches here are synthetic (no BOS); the trainer tests need the real vocab
        "--data.seq_len=32", "--optim.muon_weight_decay=0.1", "--optim.adam_weight_decay=0.01",
        # Adam's step is g/(|g| + eps): with eps=1e-10 an embedding row whose gradient nearly cancels
        # (|g| ~ 1e-10) turns reduction-order rounding into O(lr) differences. A larger eps keeps the
        # comparison about the distributed machinery, not about that conditioning.
        "--optim.adam_eps=1e-6"]
SEQ = 32


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_cfg(extra=()):
    return apply_overrides(load_preset("tiny-cpu"), TINY + list(extra))


def global_batch(rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 512, (rows, SEQ), generator=g)
    y = torch.randint(0, 512, (rows, SEQ), generator=g)
    return x.int(), y


def tiny_model(cfg):
    """The tiny model with every weight nonzero: at init the zero head and output projections give
    most parameters exactly-zero gradients, and Adam on ~0 gradients amplifies rounding noise."""
    model = build_model(cfg.model, SEQ, "cpu", seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def set_schedule(opts, mult, momentum):
    """What the trainer does each step: per-group lr from initial_lr, Muon momentum."""
    opts = list(opts)  # [adam, muon]: a container iterates its members in that order
    for opt in opts:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * mult
    for group in opts[1].param_groups:
        group["momentum"] = momentum


def assert_states_close(a, b, atol):
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        for k, v in a["state"][i].items():
            torch.testing.assert_close(b["state"][i][k].float(), v.float(), atol=atol, rtol=1e-4, msg=f"{i}/{k}")


# ------------------------------------------------------------------------------------------------
# Single process: no spawn.

def test_one_rank_is_the_single_process_math():
    """DistAdam / DistMuon with world size 1 make exactly torch AdamW's / Muon's updates."""
    cfg = tiny_cfg()
    ref = tiny_model(cfg)
    model = copy.deepcopy(ref)
    ref_opts = build_optimizers(ref, cfg.optim, torch.device("cpu"))
    assert isinstance(ref_opts.adam, torch.optim.AdamW) and type(ref_opts.muon) is Muon
    assert isinstance(grad_sync_of(ref_opts), NoSync) and isinstance(ref_opts.grad_sync, NoSync)
    sync = GradSync(1, 0, torch.device("cpu"))
    o = cfg.optim
    groups = model.param_groups()
    adam_groups = [dict(params=groups[n], lr=lr, name=n) for n, lr in
                   (("embed", o.embed_lr), ("value_embed", o.value_embed_lr), ("head", o.head_lr),
                    ("scalar", o.scalar_lr))]
    opts = [DistAdam(adam_groups, sync, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                     weight_decay=o.adam_weight_decay),
            DistMuon(groups["matrix"], sync, lr=o.muon_lr, momentum=o.muon_momentum, weight_decay=o.muon_weight_decay)]
    for opt in opts:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    x, y = global_batch(4)
    for step, (mult, mom) in enumerate([(1.0, 0.85), (0.5, 0.9), (0.25, 0.95)]):
        for m, os_ in ((ref, ref_opts), (model, opts)):
            set_schedule(os_, mult, mom)
            m(x, y).backward()
            for o in os_:
                o.step()
            m.zero_grad(set_to_none=True)
    for (n, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6, msg=n)
    assert_states_close(ref_opts.adam.state_dict(), opts[0].state_dict(), atol=1e-7)
    assert_states_close(ref_opts.muon.state_dict(), opts[1].state_dict(), atol=0)


def test_single_process_clip_and_no_group():
    assert init_distributed("cpu").world_size == 1
    teardown()  # nothing was created: a no-op
    cfg = tiny_cfg()
    model = build_model(cfg.model, SEQ, "cpu", seed=0)
    opts = build_optimizers(model, cfg.optim, torch.device("cpu"))
    x, y = global_batch(2)
    model(x, y).backward()
    norm = clip_grad_norm_(opts, 0.01)
    assert norm > 0.01
    total = torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()
    torch.testing.assert_close(total, torch.tensor(0.01), rtol=1e-3, atol=0)


def test_batch_that_does_not_divide_across_ranks_is_a_config_error():
    cfg = tiny_cfg(["--train.batch_tokens=256"])  # 8 rows of 32
    assert micro_batch_rows(cfg, 4) == (2, 1)
    with pytest.raises(ConfigError, match="does not divide across 3 ranks"):
        micro_batch_rows(cfg, 3)
    with pytest.raises(ConfigError, match="micro_batch_size=3"):
        micro_batch_rows(tiny_cfg(["--train.batch_tokens=256", "--train.micro_batch_size=3"]), 2)


# ------------------------------------------------------------------------------------------------
# Several ranks.

def _sharded_worker(rank, world, out):
    info = init_distributed("cpu")
    assert (info.rank, info.world_size) == (rank, world)
    cfg = tiny_cfg()
    cpu = torch.device("cpu")
    ref = tiny_model(cfg)
    model = copy.deepcopy(ref)
    ref_opts = build_optimizers(ref, cfg.optim, cpu, world_size=1)
    opts = build_optimizers(model, cfg.optim, cpu)
    assert isinstance(opts.adam, DistAdam) and isinstance(opts.muon, DistMuon)
    sync = grad_sync_of(opts)
    accum, rows = 2, 2  # two micro-steps of two rows per rank
    schedule = [(1.0, 0.85), (0.5, 0.9), (0.3, 0.95)]
    for step, (mult, mom) in enumerate(schedule):
        x, y = global_batch(world * accum * rows, seed=step)
        set_schedule(ref_opts, mult, mom)
        ref(x, y).backward()  # the mean over the whole global batch
        set_schedule(opts, mult, mom)
        for i in range(accum):
            sl = slice((i * world + rank) * rows, (i * world + rank + 1) * rows)
            loss = model(x[sl], y[sl]) / accum
            sync.prepare(final=i == accum - 1)
            loss.backward()
            if i < accum - 1:
                assert not any(b.launched for b in sync.buckets), "a non-final micro-step communicated"
        if step > 0:  # the launch order is agreed in the first step; from then on the hooks launch
            assert all(b.launched for b in sync.buckets), "backward hooks did not launch every bucket"
        # Gradients after the overlapped reduction == the single-process gradients, part by part.
        ref_grads = {id(p): r.grad for p, r in zip(model.parameters(), ref.parameters())}
        adam_parts = opts.adam.reduced_grads()
        for (p, _), g in zip(opts.adam._params_in_launch_order(), adam_parts):
            _, lo, n = opts.adam._shard(p)
            torch.testing.assert_close(g, ref_grads[id(p)].reshape(-1)[lo:lo + n], atol=1e-6, rtol=1e-5)
        muon_parts = opts.muon.reduced_grads()
        owned = [ps[rank] for _, ps, _ in opts.muon._mine() if rank < len(ps)]
        assert len(owned) == len(muon_parts)
        for p, g in zip(owned, muon_parts):
            torch.testing.assert_close(g, ref_grads[id(p)], atol=1e-6, rtol=1e-5)
        if step == 2:  # global-norm clipping on the sharded gradients == torch's on the full ones
            norm_ref = clip_grad_norm_(ref_opts, 0.05)
            norm = clip_grad_norm_(opts, 0.05)
            assert norm_ref > 0.1, "clipping would not be active"
            torch.testing.assert_close(norm, norm_ref, rtol=1e-5, atol=0)
        for o in [*ref_opts, *opts]:
            o.step()
        ref.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        # Adam (lr up to 0.3 here) divides by sqrt(v): gradient rounding of ~1e-7 relative shows up
        # as ~1e-5 in a few elements; a real bug (wrong slice, stale lr, missing average) is O(lr).
        for (n, a), b in zip(ref.named_parameters(), model.parameters()):
            torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4, msg=lambda m: f"step {step}: {n}: {m}")
        if step == 1:
            # Checkpoint round trip: full state equals the single-process state, and loads back (re-shards).
            full = [o.state_dict() for o in opts]
            for a, b in zip(ref_opts, full):
                assert_states_close(a.state_dict(), b, atol=2e-5)
            for o, sd in zip(opts, full):
                o.load_state_dict(copy.deepcopy(sd))
            # ...and through the container, by parameter name, as checkpoints do
            named = opts.state_dict()
            assert set(named["adam"]) | set(named["muon"]) == {n for n, _ in model.named_parameters()}
            opts.load_state_dict(copy.deepcopy(named))
    torch.save({"rank": rank, "params": [p.detach() for p in model.parameters()]}, f"{out}/rank{rank}.pt")
    _bf16_check(rank, world)
    _bf16_comm_check(rank, world)
    _adam_every_check(rank, world, out)
    torch.distributed.destroy_process_group()


def _bf16_check(rank, world):
    """bf16 parameters and gradients travel and update in bf16 (loose tolerance: bf16 rounding)."""
    torch.manual_seed(1)
    ws = [torch.nn.Parameter(torch.randn(8, 16, dtype=torch.bfloat16)) for _ in range(3)]
    vs = [torch.nn.Parameter(torch.randn(5, dtype=torch.bfloat16))]
    ref_w = [torch.nn.Parameter(w.detach().float()) for w in ws]
    ref_v = [torch.nn.Parameter(v.detach().float()) for v in vs]
    sync = GradSync(world, rank, torch.device("cpu"))
    opts = [DistAdam(vs, sync, lr=0.01), DistMuon(ws, sync, lr=0.02)]
    refs = [torch.optim.AdamW(ref_v, lr=0.01, weight_decay=0.0), Muon(ref_w, lr=0.02)]
    grads = torch.randn(world, 3, 8, 16).bfloat16()
    gv = torch.randn(world, 5).bfloat16()
    for w, r, k in zip(ws, ref_w, range(3)):
        w.grad = grads[rank, k].clone()
        r.grad = grads[:, k].float().mean(0)
    vs[0].grad, ref_v[0].grad = gv[rank].clone(), gv.float().mean(0)
    for o in opts + refs:
        o.step()
    for a, b in zip(ref_w + ref_v, ws + vs):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(b.float(), a.detach(), atol=0.03, rtol=0.03)
    sync.remove_hooks()


def _bf16_comm_check(rank, world):
    """parallel.grad_comm_dtype=bf16: every reduce-scatter carries bf16, and the fp32 model's reduced
    gradients and updates stay within bf16 rounding of one process accumulating the same micro-batches."""
    import speedgpt.optim.adam as adam_mod
    import speedgpt.optim.muon as muon_mod

    cfg = tiny_cfg()
    cpu = torch.device("cpu")
    ref = tiny_model(cfg)
    model = copy.deepcopy(ref)
    ref_opts = build_optimizers(ref, cfg.optim, cpu, world_size=1)
    opts = build_optimizers(model, cfg.optim, cpu, grad_comm_dtype=grad_comm_dtype("bf16"))
    sync = grad_sync_of(opts)
    sent = []  # the dtypes every reduce-scatter was handed (input, output)

    def spy(out, inp, async_op=True):
        sent.append((inp.dtype, out.dtype))
        return reduce_scatter(out, inp, async_op=async_op)

    adam_mod.reduce_scatter = muon_mod.reduce_scatter = spy  # both optimizers bound the name at import
    try:
        accum, rows = 2, 2
        for step, (mult, mom) in enumerate([(1.0, 0.85), (0.5, 0.9)]):
            with torch.no_grad():  # each step from the reference's weights: the errors below are this step's
                for p, r in zip(model.parameters(), ref.parameters()):
                    p.copy_(r)
            start = [p.detach().clone() for p in ref.parameters()]
            x, y = global_batch(world * accum * rows, seed=10 + step)
            set_schedule(ref_opts, mult, mom)
            set_schedule(opts, mult, mom)
            for i in range(accum):  # one process, gradient accumulation over the same micro-batches
                (ref(x[i * world * rows:(i + 1) * world * rows], y[i * world * rows:(i + 1) * world * rows])
                 / accum).backward()
                sl = slice((i * world + rank) * rows, (i * world + rank + 1) * rows)
                sync.prepare(final=i == accum - 1)
                (model(x[sl], y[sl]) / accum).backward()
            # Bound per element: W casts of g_r/W to bf16 and W - 1 bf16 additions, each rounding by at
            # most 2^-8 (bf16's unit roundoff) of at most sum_r |g_r| / W: |error| <= W * 2^-8 * sum_r |g_r| / W.
            abs_sum = {}
            for p in model.parameters():
                a = p.grad.abs() / world
                torch.distributed.all_reduce(a)
                abs_sum[id(p)] = a
            ref_grads = {id(p): r.grad for p, r in zip(model.parameters(), ref.parameters())}
            parts = [(p, g, slice(opts.adam._shard(p)[1], sum(opts.adam._shard(p)[1:])))
                     for (p, _), g in zip(opts.adam._params_in_launch_order(), opts.adam.reduced_grads())]
            owned = [ps[rank] for _, ps, _ in opts.muon._mine() if rank < len(ps)]
            parts += [(p, g, slice(None)) for p, g in zip(owned, opts.muon.reduced_grads())]
            for p, g, sl in parts:
                assert g.dtype == torch.float32, "the optimizers must read the reduced gradient in fp32"
                want = ref_grads[id(p)].reshape(-1)[sl]
                bound = world * 2.0 ** -8 * abs_sum[id(p)].reshape(-1)[sl] + 1e-7
                err = (g.reshape(-1) - want).abs()
                assert (err <= bound).all(), f"step {step}: {tuple(p.shape)}: error {err.max():.3g} over the bf16 bound"
            for o in [*ref_opts, *opts]:
                o.step()
            ref.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
            # Both optimizers normalize the gradient (Muon orthogonalizes, Adam divides by sqrt(v)), so an
            # update's relative error follows the gradient's, at worst W * 2^-8 = 1.2 % here; twice that
            # leaves room for Newton-Schulz's nonlinearity and Adam's sign flips on near-zero elements
            # (measured: at most 1.05 %, in attention matrices). Wrong slices or a lost conversion are O(1).
            for (n, a), b, p0 in zip(ref.named_parameters(), model.parameters(), start):
                assert b.dtype == torch.float32
                moved, moved_ref = b.detach() - p0, a.detach() - p0
                rel = ((moved - moved_ref).norm() / moved_ref.norm()).item()
                assert rel <= 2 * world * 2.0 ** -8, f"step {step}: {n}: update {rel:.2%} off the fp32 one"
    finally:
        adam_mod.reduce_scatter = muon_mod.reduce_scatter = reduce_scatter
    n_buckets = len(sync.buckets)
    assert sent == [(torch.bfloat16, torch.bfloat16)] * 2 * n_buckets, "a reduce-scatter did not carry bf16"
    sync.remove_hooks()


WORLD = 3  # 3 ranks: padded Muon chunks and Adam slices with empty ranks


@pytest.fixture(scope="module")
def sharded_ranks(tmp_path_factory):
    """One spawn of WORLD gloo ranks for the checks below (each spawn costs seconds of start-up): the folder
    their results are in."""
    out = tmp_path_factory.mktemp("sharded")
    spawn_local(_sharded_worker, WORLD, str(out))
    return out


def test_overlapped_reduction_and_sharded_step_match_single_process(sharded_ranks):
    tmp_path, world = sharded_ranks, WORLD
    params = [torch.load(tmp_path / f"rank{r}.pt")["params"] for r in range(world)]
    for r in range(1, world):  # every rank ends with bitwise the same model
        for a, b in zip(params[0], params[r]):
            assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------
# optim.adam_every on several ranks: no collective for Adam's gradients on the steps it does not update.

ADAM_EVERY = ["--optim.adam_every=2", "--model.tie_embed_frac=0.5"]  # tied for steps 0-1, untied from 2 (of 6)
EVERY_STEPS = 6


def test_adam_reduction_waits_only_where_nothing_reads_the_gradients_every_step():
    from speedgpt.optim.build import defer_adam_reduction
    from speedgpt.train.guard import NumericsGuard

    o = tiny_cfg(ADAM_EVERY).optim
    assert defer_adam_reduction(o, 2)
    assert not defer_adam_reduction(o, 1)  # one rank: nothing to reduce
    assert not defer_adam_reduction(o, 2, strategy="fsdp")  # FSDP reduces in its own backward
    assert not defer_adam_reduction(tiny_cfg(ADAM_EVERY + ["--optim.grad_clip=1.0"]).optim, 2)  # the norm reads them
    assert not defer_adam_reduction(o, 2, grads_read_each_step=True)
    assert not defer_adam_reduction(tiny_cfg().optim, 2)  # adam_every=1: Adam steps every step
    cpu = torch.device("cpu")
    assert NumericsGuard("skip", cpu, 0, 2).reads_gradients  # its check reads every step's gradients
    assert not any(NumericsGuard(mode, cpu, 0, 2).reads_gradients for mode in ("rollback", "abort"))


def _every_steps(model, opts, steps, world, rank, counts=None, clip=0.0):
    """The trainer's step (train/loop.py) on 2 micro-steps of 2 rows per rank of WORLD; one rank (world=1)
    takes the whole batch at once. counts: per step, the reduce-scatters [Adam's, Muon's] issued."""
    sync = grad_sync_of(opts)
    accum, rows = (2, 2) if world > 1 else (1, 4 * WORLD)
    for step in steps:
        x, y = global_batch(4 * WORLD, seed=step)
        model.sync_embed_tying(step, EVERY_STEPS, opts)
        if counts is not None:
            counts.append([0, 0])
        opts.begin_step(step)
        agreed = world > 1 and sync.order is not None
        for i in range(accum):
            sl = slice((i * world + rank) * rows, (i * world + rank + 1) * rows)
            sync.prepare(final=i == accum - 1)
            (model(x[sl], y[sl]) / accum).backward()
        if agreed:  # the order is agreed (on the first step without a hold): the hooks launched every bucket not held
            waits = opts.adam.defer_reduce and not opts.adam_due(step)
            held = {id(b) for b in opts.adam._bucket.values()} if waits else ()
            assert all(b.launched != (id(b) in held) for b in sync.buckets), f"step {step}"
        opts.fold_tied_grads()
        if clip:
            clip_grad_norm_(opts, clip)
        opts.step(step)
        model.zero_grad(set_to_none=True)


def _adam_every_check(rank, world, out):
    """optim.adam_every=2 on `world` ranks (the test below reads what it saves)."""
    import speedgpt.optim.adam as adam_mod
    import speedgpt.optim.muon as muon_mod

    cfg = tiny_cfg(ADAM_EVERY)
    cpu = torch.device("cpu")
    counts = []

    def spy(which):
        def rs(o, i, async_op=True):
            counts[-1][which] += 1
            return reduce_scatter(o, i, async_op=async_op)
        return rs

    adam_mod.reduce_scatter, muon_mod.reduce_scatter = spy(0), spy(1)
    try:
        start = tiny_model(cfg)
        # Today's path where the gradients are read every step (here: the guard's skip mode) ...
        old_model = copy.deepcopy(start)
        old = build_optimizers(old_model, cfg.optim, cpu, grads_read_each_step=True)
        assert not old.adam.defer_reduce
        _every_steps(old_model, old, range(EVERY_STEPS), world, rank, counts)
        old_counts, counts[:] = list(counts), []
        # ... and the deferred one, with a checkpoint between two Adam steps (after step index 2)
        model = copy.deepcopy(start)
        opts = build_optimizers(model, cfg.optim, cpu)
        sync = grad_sync_of(opts)
        assert opts.adam.defer_reduce
        _every_steps(model, opts, range(1), world, rank, counts)
        assert sync.order is None  # not agreed on a step with Adam's buckets held
        tied_waiting = sorted(opts.state_dict()["adam_pending"])  # a checkpoint after step 0, tied
        _every_steps(model, opts, range(1, 3), world, rank, counts)
        # agreed on step 1, from a whole step: the head's gradient is ready first (not after every Muon bucket)
        assert sync.order[0] is opts.adam._bucket[model.lm_head.weight]
        saved = {"model": copy.deepcopy(model.state_dict()), "optim": opts.state_dict()}
        _every_steps(model, opts, range(3, EVERY_STEPS), world, rank, counts)
        new_counts, counts[:] = list(counts), []
        # the same checkpoint resumed on as many ranks
        resumed = tiny_model(cfg)
        resumed.load_state_dict(saved["model"])
        ropts = build_optimizers(resumed, cfg.optim, cpu)
        ropts.load_state_dict(copy.deepcopy(saved["optim"]))
        _every_steps(resumed, ropts, range(3, EVERY_STEPS), world, rank, counts)
        resumed_counts, counts[:] = list(counts), []
        # grad_clip reads Adam's reduced gradients every step: they are reduced every step
        clipped = copy.deepcopy(start)
        copts = build_optimizers(clipped, tiny_cfg(ADAM_EVERY + ["--optim.grad_clip=0.05"]).optim, cpu)
        assert not copts.adam.defer_reduce
        _every_steps(clipped, copts, range(2), world, rank, counts, clip=0.05)
        clip_counts = list(counts)
    finally:
        adam_mod.reduce_scatter, muon_mod.reduce_scatter = reduce_scatter, reduce_scatter
    n_adam, n_muon = len(opts.adam._bucket), old_counts[0][1]
    assert old_counts == [[n_adam, n_muon]] * EVERY_STEPS
    assert new_counts == [[0, n_muon], [n_adam, n_muon]] * (EVERY_STEPS // 2), "Adam communicated without an update"
    assert resumed_counts == new_counts[3:]
    assert clip_counts == [[n_adam, n_muon]] * 2
    # fp32 here; both paths sum the same gradients, in another order (mean of per-rank sums against the sum of
    # per-step means, a resume's reduced sum then averaged again): ~1e-7 relative. Adam's g/sqrt(v) turns that
    # into up to ~1e-5 on near-zero elements (the tolerance of the sharded test above); a lost or doubled
    # step's gradient moves parameters by O(lr) = 1e-2..0.3.
    for (n, a), b, c in zip(old_model.named_parameters(), model.parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4, msg=lambda m: f"deferred vs every step: {n}: {m}")
        torch.testing.assert_close(c, b, atol=2e-4, rtol=1e-4, msg=lambda m: f"resumed on {world} ranks: {n}: {m}")
    torch.save({"saved": saved, "final": [p.detach() for p in model.parameters()], "tied_waiting": tied_waiting},
               f"{out}/adam_every{rank}.pt")
    for s in (grad_sync_of(o) for o in (old, opts, ropts, copts)):
        s.remove_hooks()
    _adam_every_edges(rank, world, out, start)


# (step, parameter) left without a gradient on rank 1: on a held step while tied and after the untie, on Adam's
# steps, and the head on the step after a window whose sum waits for it
MISSING = {(0, "value_embeds.0.weight"), (1, "value_embeds.0.weight"), (2, "embed.weight"), (3, "lm_head.weight")}


def _set_grad_steps(model, opts, steps, rank):
    """The trainer's step with gradients set instead of a backward (MISSING: none on rank 1), each added to what
    the parameter holds, as a backward adds; no hook runs, so the optimizers' first wait launches every bucket."""
    for step in steps:
        model.sync_embed_tying(step, EVERY_STEPS, opts)
        opts.begin_step(step)
        for i, (name, p) in enumerate(model.named_parameters()):
            if rank == 1 and (step, name) in MISSING:
                continue
            # in [0.5, 1.5): no sum near zero, whose Adam step g/sqrt(v) would turn rounding into O(lr)
            g = 0.5 + torch.rand(p.shape, generator=torch.Generator().manual_seed(1000 * step + 100 * rank + i))
            p.grad = g if p.grad is None else p.grad + g
        opts.fold_tied_grads()
        opts.step(step)
        model.zero_grad(set_to_none=True)


def _adam_every_edges(rank, world, out, start):
    """Two edges of optim.adam_every=2 on `world` ranks (the tests below read what it saves): Adam parameters without
    a gradient on one rank, and a load (the warmup's reset, a rollback) after a step whose gradients wait."""
    cfg, cpu = tiny_cfg(ADAM_EVERY), torch.device("cpu")
    runs = {}
    for key, read_each_step in (("every", True), ("deferred", False)):
        model = copy.deepcopy(start)
        opts = build_optimizers(model, cfg.optim, cpu, grads_read_each_step=read_each_step)
        assert opts.adam.defer_reduce != read_each_step
        _set_grad_steps(model, opts, range(3), rank)
        pending = opts.state_dict()["adam_pending"]  # between two Adam steps: the head's sum misses rank 1's
        _set_grad_steps(model, opts, range(3, EVERY_STEPS), rank)
        runs[key] = {"pending": pending, "final": [p.detach() for p in model.parameters()]}
        grad_sync_of(opts).remove_hooks()
    # A held step, then the state from before it loaded (warmup_then_reset, a rollback to a window's start): no
    # gradient set aside by that step may reach the steps after the load
    model, fresh = copy.deepcopy(start), copy.deepcopy(start)
    opts, fresh_opts = (build_optimizers(m, cfg.optim, cpu) for m in (model, fresh))
    before = copy.deepcopy(model.state_dict()), opts.state_dict()
    _every_steps(model, opts, range(1), world, rank)
    model.load_state_dict(before[0])
    opts.load_state_dict(before[1])
    fresh.load_state_dict(before[0])  # as loaded: tied, the load gives the embedding the head's values
    for m, o in ((model, opts), (fresh, fresh_opts)):
        _every_steps(m, o, range(2), world, rank)
        grad_sync_of(o).remove_hooks()
    runs["reloaded"] = [p.detach() for p in model.parameters()]
    runs["fresh"] = [p.detach() for p in fresh.parameters()]
    torch.save(runs, f"{out}/adam_every_edges{rank}.pt")


def test_adam_every_reduces_adams_gradients_only_on_its_steps_and_resumes_between_them(sharded_ranks):
    """WORLD gloo ranks, optim.adam_every=2: a step without an Adam update issues no Adam collective, the
    parameters equal those of the path that reduces every step, and a checkpoint between two Adam steps
    (its waiting sum reduced whole) resumes on WORLD ranks (in the worker) and on 1 (here)."""
    results = [torch.load(sharded_ranks / f"adam_every{r}.pt") for r in range(WORLD)]
    for other in results[1:]:
        for a, b in zip(results[0]["final"], other["final"]):
            assert torch.equal(a, b)  # every rank holds the same weights
    saved = results[0]["saved"]
    assert saved["optim"]["adam_pending"]["lm_head.weight"]["grad"].abs().sum() > 0  # written between Adam steps
    # tied, the embedding's gradient waits in the head's sum: no entry of its own, as one rank writes
    assert "lm_head.weight" in results[0]["tied_waiting"] and "embed.weight" not in results[0]["tied_waiting"]
    cfg = tiny_cfg(ADAM_EVERY)
    model = tiny_model(cfg)
    model.load_state_dict(saved["model"])
    opts = build_optimizers(model, cfg.optim, torch.device("cpu"), world_size=1)
    opts.load_state_dict(copy.deepcopy(saved["optim"]))
    _every_steps(model, opts, range(3, EVERY_STEPS), 1, 0)
    for (n, a), b in zip(model.named_parameters(), results[0]["final"]):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4, msg=lambda m: f"resumed on 1 rank: {n}: {m}")


def test_adam_every_on_ranks_where_some_adam_parameters_have_no_gradient(sharded_ranks):
    """MISSING's parameters have no gradient on rank 1 on held steps and on Adam's steps (a zero there): the waiting
    sums a checkpoint stores and the parameters equal those of the path that reduces every step."""
    for r in range(WORLD):
        runs = torch.load(sharded_ranks / f"adam_every_edges{r}.pt")
        every, deferred = runs["every"], runs["deferred"]
        assert set(every["pending"]) <= set(deferred["pending"])
        for name, st in deferred["pending"].items():
            want = every["pending"][name]["grad"] if name in every["pending"] else torch.zeros_like(st["grad"])
            torch.testing.assert_close(st["grad"], want, msg=lambda m: f"waiting sum of {name}: {m}")
        for i, (a, b) in enumerate(zip(every["final"], deferred["final"])):
            torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4, msg=lambda m: f"parameter {i}: {m}")


def test_a_load_after_a_held_step_drops_the_gradients_it_set_aside(sharded_ranks):
    """warmup_then_reset and a rollback load a state over a step whose gradients wait unreduced: the steps after
    the load train as from that state, bit for bit."""
    for r in range(WORLD):
        runs = torch.load(sharded_ranks / f"adam_every_edges{r}.pt")
        for i, (a, b) in enumerate(zip(runs["fresh"], runs["reloaded"])):
            assert torch.equal(a, b), f"parameter {i} on rank {r}"
