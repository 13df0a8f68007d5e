"""The later records' embedding-side switches (model/embeddings.py, model/gates.py): shapes,
initialization, off-equals-before, and that each one, on, changes what the model computes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from speedgpt.config import ConfigError, apply_overrides, load_preset
from speedgpt.data.tokenizer import BOS_ID
from speedgpt.model.attention import KVCache
from speedgpt.model.build import build_model
from speedgpt.model.embeddings import bigram_hash
from speedgpt.model.gates import rescale_for_softcap, rescale_logits, RESCALE_CAP
from speedgpt.model.runtime import runtime_for
from speedgpt.optim.build import adam_groups, build_optimizers
from speedgpt.plan import validate

SEQ = 32
VOCAB = 1024  # small tables: these tests run on a shared CPU
SMALL = ["--model.depth=4", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=2",
         "--model.attn_gate_dim=8", f"--model.vocab_size={VOCAB}"]
SWITCHES = {  # switch -> its overrides (on)
    "bigram": ["--model.bigram_vocab_mult=2"],
    "smear": ["--model.smear=true"],
    "value_embed_gates": ["--model.value_embed_gates=true"],
    "skip_gates": ["--model.skip_gates=true"],
    "backout": ["--model.backout_layer=2"],
    "logit_rescale": ["--model.logit_rescale=true"],
    "tie_embed": ["--model.tie_embed_frac=0.5"],
    "value_embed_layers": ["--model.value_embed_layers=[0,1,3]"],
    "mimetic_vo": ["--model.mimetic_vo_beta=0.05"],
}


def cfg_with(*extra):
    cfg = apply_overrides(load_preset("tiny-cpu"), SMALL + list(extra))
    validate(cfg)
    return cfg.model


def build(*extra, seed=0):
    return build_model(cfg_with(*extra), SEQ, "cpu", seed=seed)


def batch(B=2, T=SEQ, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (B, T), generator=g)  # one document per row (no BOS in this vocabulary)
    y = torch.randint(0, VOCAB, (B, T), generator=g)
    return x, y


def randomize(m, seed=1):
    """Every parameter random (also the zero-initialized ones), so a switch's path carries signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def copy_shared(dst, src):
    """Load src's parameters into dst where names match (dst may have more: a switch's own)."""
    own = dst.state_dict()
    own.update({k: v for k, v in src.state_dict().items() if k in own})
    dst.load_state_dict(own)


# ---------------------------------------------------------------------------------------------
# Off equals before: the default model has no new parameter, buffer or group.

def test_defaults_add_no_parameters_buffers_or_groups():
    m = build()
    names = set(m.state_dict())
    assert not any(k.startswith(("bigram", "smear", "skip_gates", "backout", "embed_untied")) or "ve_gate" in k
                   for k in names)
    groups = m.param_groups()
    assert all(not groups[g] for g in ("bigram_embed", "smear_gate", "skip_gate", "value_embed_gate"))
    assert [g["name"] for g in adam_groups(m, load_preset("tiny-cpu").optim)] == ["embed", "value_embed", "head",
                                                                                  "scalar"]


@pytest.mark.parametrize("switch", ["bigram", "smear", "value_embed_gates", "skip_gates", "tie_embed"])
def test_zero_initialized_switches_start_as_the_model_without_them(switch):
    """Switches whose new parameters start neutral give the same outputs at init as the model without
    them (same seed: the new fills draw no random numbers, so every other weight is the same)."""
    off, on = build(), build(*SWITCHES[switch])
    for (name, p) in off.named_parameters():
        if switch != "tie_embed" or name not in ("lm_head.weight", "embed.weight"):
            assert torch.equal(p, dict(on.named_parameters())[name]), name
    if switch == "tie_embed":  # the head is the lookup table (the embedding holds it): small random, not zero
        assert torch.equal(on.embed.weight, on.lm_head.weight)
        copy_shared(off, on)
        with torch.no_grad():
            off.embed.weight.copy_(on.lm_head.weight)
    x, y = batch()
    assert torch.equal(off(x, y), on(x, y))


@pytest.mark.parametrize("switch", sorted(set(SWITCHES) - {"mimetic_vo", "tie_embed"}))
def test_each_switch_changes_the_output(switch):
    """With every weight random (the same in both where names match), the switch changes the logits. (Not
    tie_embed: a tied model computes as an untied one whose embedding is its head; the tying changes the
    training, test_each_switch_changes_the_loss_after_training_steps.)"""
    off, on = build(), build(*SWITCHES[switch])
    randomize(on)
    copy_shared(off, on)
    x, _ = batch()
    assert (off(x) - on(x)).abs().max() > 1e-3


def test_mimetic_init_changes_the_output_at_init():
    """An init-only switch: same seed, same head, the attention's V and O now contribute."""
    off, on = build(), build(*SWITCHES["mimetic_vo"])
    with torch.no_grad():
        for m in (off, on):
            m.lm_head.weight.copy_(torch.randn(m.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
    x, _ = batch()
    assert (off(x) - on(x)).abs().max() > 1e-3


def test_each_switch_changes_the_loss_after_training_steps():
    """From the same seed, a few Adam/Muon steps on the same data end at another loss with each switch."""
    x, y = batch()

    def trained_loss(*extra):
        cfg = apply_overrides(load_preset("tiny-cpu"), SMALL + list(extra))
        m = build_model(cfg.model, SEQ, "cpu", seed=0)
        opt = build_optimizers(m, cfg.optim, torch.device("cpu"), world_size=1)
        for step in range(3):
            m.sync_embed_tying(step, 4, opt)
            m(x, y).backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            return m(x, y).item()

    base = trained_loss()
    for switch, extra in SWITCHES.items():
        assert trained_loss(*extra) != base, switch


# ---------------------------------------------------------------------------------------------
# Bigram hash embedding (record #62)

def test_bigram_hash_is_the_records_formula():
    x = torch.tensor([[BOS_ID, 10, 50000, 7]])
    rows = 5 * 50304
    h = bigram_hash(x, rows)
    mod = rows - 1
    expected = [mod] + [(36313 * int(c)) ^ (27191 * int(p)) for p, c in zip(x[0, :-1], x[0, 1:])]
    assert h.tolist() == [[expected[0]] + [e % mod for e in expected[1:]]]
    assert int(h.max()) < rows and int(h.min()) >= 0
    # With a previous token (KV cache), the first position hashes with it instead of the reserved row
    assert bigram_hash(x[:, 1:], rows, prev_B1=x[:, :1]).tolist() == [h[0, 1:].tolist()]


def test_bigram_table_shape_init_and_optimizer_group():
    m = build(*SWITCHES["bigram"])
    assert m.bigram.embed.weight.shape == (2 * VOCAB, 64)  # a multiple of the padded vocab
    assert m.bigram.embed.weight.abs().sum() == 0  # zero init
    assert torch.equal(m.bigram.lambdas, torch.full((4,), 0.1))  # one per layer
    groups = {g["name"]: g for g in adam_groups(m, load_preset("tiny-cpu").optim)}
    assert groups["bigram_embed"]["params"] == [m.bigram.embed.weight]
    assert groups["bigram_embed"]["lr"] == pytest.approx(0.6)  # record #62: 0.008 x lr_mul 75
    assert any(p is m.bigram.lambdas for p in groups["scalar"]["params"])
    assert any(e is m.bigram.embed for e in m.embeddings())  # bf16_embeds, fsdp sharding


# ---------------------------------------------------------------------------------------------
# Smear, gates, backout

def test_smear_mixes_only_the_previous_token():
    m = build(*SWITCHES["smear"])
    assert m.smear.gate.weight.shape == (1, 8) and m.smear.gate.weight.abs().sum() == 0
    assert m.smear.smear_lambda.item() == 0
    with torch.no_grad():
        m.smear.smear_lambda.fill_(1.0)
    e = torch.randn(1, 5, 64)
    out = m.smear(e)
    assert torch.equal(out[:, 0], e[:, 0])  # no previous token in the row
    assert torch.allclose(out[:, 1:], e[:, 1:] + 0.5 * e[:, :-1])  # lambda * sigmoid(0) = 0.5


def test_gate_shapes_and_groups():
    m = build("--model.value_embed_gates=true", "--model.skip_gates=true", "--model.smear=true")
    gated = [i for i, b in enumerate(m.blocks) if b.ve_gate is not None]
    assert gated == [0, 1, 2, 3]  # value embeddings on layers 0, 1 (first two) and 2, 3 (last two)
    assert m.blocks[0].ve_gate.shape == (4, 8) and m.blocks[0].ve_gate.abs().sum() == 0  # per head
    assert m.skip_gates.weight.shape == (2, 8)  # one per skip connection
    groups = m.param_groups()
    muon = {id(p) for p in groups["matrix"]}
    assert not any(id(b.ve_gate) in muon for b in m.blocks)  # gates are Adam's, at their own lrs
    lrs = {g["name"]: g["lr"] for g in adam_groups(m, load_preset("tiny-cpu").optim)}
    assert lrs["smear_gate"] == pytest.approx(8e-5) and lrs["skip_gate"] == pytest.approx(4e-4)
    assert lrs["value_embed_gate"] == pytest.approx(0.008)


def test_backout_subtracts_a_share_of_the_chosen_block():
    m = build(*SWITCHES["backout"])
    assert m.backout_lambda.item() == 0.5
    randomize(m)
    x, _ = batch()
    with torch.no_grad():
        m.backout_lambda.zero_()
        zero = m(x)
        m.backout_lambda.fill_(0.5)
        half = m(x)
    assert not torch.allclose(zero, half)


# ---------------------------------------------------------------------------------------------
# Asymmetric logit rescale (record #54)

def test_logit_rescale_fused_form_gives_the_same_cross_entropy():
    z = torch.randn(6, 50) * 10
    t = torch.randint(0, 50, (6,))
    ref = torch.nn.functional.cross_entropy(rescale_logits(z), t)
    capped = RESCALE_CAP * torch.tanh(rescale_for_softcap(z) / RESCALE_CAP)
    assert torch.allclose(torch.nn.functional.cross_entropy(capped, t), ref, atol=1e-5)
    assert torch.allclose(rescale_logits(torch.zeros(1)), torch.tensor([23 * torch.sigmoid(torch.tensor(5 / 7.5))]))


def test_logit_rescale_fused_loss_path_matches_torch_path():
    from speedgpt.model.kernels.softcap_ce import softcap_cross_entropy

    m = build(*SWITCHES["logit_rescale"])
    randomize(m)
    x, y = batch()
    torch_loss = m(x, y)
    m.loss_path = "fused_ce"  # the kernel's CPU reference: same math as the Triton kernel
    assert torch.allclose(m(x, y), torch_loss, atol=1e-5)
    assert softcap_cross_entropy is not None


# ---------------------------------------------------------------------------------------------
# Tied, then untied embedding and lm_head (records #51, #53)

def test_tied_embedding_holds_the_head_then_untie_copies_weights_and_adam_state():
    cfg = apply_overrides(load_preset("tiny-cpu"), SMALL + ["--model.tie_embed_frac=0.5"])
    m = build_model(cfg.model, SEQ, "cpu", seed=0)
    assert m.embed_tied and m.lm_head.weight.std().item() == pytest.approx(0.005, rel=0.05)
    assert torch.equal(m.embed.weight, m.lm_head.weight)  # the lookup reads the head's values from the start
    assert m.tying.untie_step(10) == 5 and m.tying.untie_step(9) == 5  # ceil(frac x steps)
    opt = build_optimizers(m, cfg.optim, torch.device("cpu"), world_size=1)
    x, y = batch()
    for step in range(3):
        assert not m.sync_embed_tying(step, 6, opt)
        m(x, y).backward()
        opt.step()
        assert m.embed.weight.grad is None and 0 < m.lm_head.weight.grad.abs().sum()  # folded into the head's
        assert m.embed.weight not in opt.adam.state  # no step of its own while tied
        opt.zero_grad()
    assert m.sync_embed_tying(3, 6, opt) and not m.embed_tied and bool(m.embed_untied)
    assert torch.equal(m.embed.weight, m.lm_head.weight) and m.tied_params() is None
    head_state, embed_state = opt.adam.state[m.lm_head.weight], opt.adam.state[m.embed.weight]
    for k in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(head_state[k], embed_state[k]) and head_state[k] is not embed_state[k]
    assert not m.sync_embed_tying(4, 6, opt)  # once
    m(x, y).backward()
    opt.step()
    assert not torch.equal(m.embed.weight, m.lm_head.weight)  # each its own update now
    # The phase is in the state dict: a fresh model loading it is untied too
    fresh = build_model(cfg.model, SEQ, "cpu", seed=1)
    assert fresh.embed_tied
    fresh.load_state_dict(m.state_dict())
    assert not fresh.embed_tied and torch.equal(fresh.embed.weight, m.embed.weight)


def test_a_tied_checkpoint_from_before_the_tying_became_data_loads_with_the_heads_values():
    """Checkpoints written before issue 33 left a tied model's unused embedding at its initialization: loaded
    now, the embedding takes the head's values, so the model computes what the old head lookup did."""
    cfg = cfg_with("--model.tie_embed_frac=0.5")
    saved = build_model(cfg, SEQ, "cpu", seed=0)
    randomize(saved)  # an embedding unlike the head, as such a checkpoint holds it
    assert saved.embed_tied and not torch.equal(saved.embed.weight, saved.lm_head.weight)
    x, y = batch()
    with torch.no_grad():
        want = old_tying(saved)(x, y)
    loaded = build_model(cfg, SEQ, "cpu", seed=1)
    loaded.load_state_dict(saved.state_dict())
    assert loaded.embed_tied and torch.equal(loaded.embed.weight, saved.lm_head.weight)
    with torch.no_grad():
        assert torch.equal(loaded(x, y), want)


def old_tying(m):
    """`m` as the tying worked before it became data (issue 33): the lookup reads the head's rows while tied
    (a Python branch that compiled the model twice), and the optimizers know nothing of the tying."""
    m.embed_tokens = lambda tokens: F.embedding(tokens, m.lm_head.weight) if m.embed_tied else m.embed(tokens)
    m.tied_params = lambda: None  # read by build_optimizers
    return m


def train_through_untie(m, cfg, steps=6, micro=2, clip=0.5):
    """The trainer's step order on 1 rank: untie check, `micro` accumulated micro-batches, fold, clip, step.
    Returns the losses, the gradient norms and, per step, whether the embedding equalled the head bit for bit
    after it."""
    from speedgpt.parallel.ddp import clip_grad_norm_

    opt = build_optimizers(m, cfg.optim, torch.device("cpu"), world_size=1)
    losses, norms, equal = [], [], []
    for step in range(steps):
        m.sync_embed_tying(step, steps, opt)
        total = 0.0
        for i in range(micro):
            x, y = batch(seed=i)  # the same two batches every step: the loss visibly falls
            loss = m(x, y) / micro
            loss.backward()
            total += loss.item()
        opt.fold_tied_grads()
        norms.append(clip_grad_norm_(opt, clip).item())  # of the tied pair's one gradient (Adam hardly sees a clip)
        opt.step(step)
        opt.zero_grad()
        losses.append(total)
        equal.append(torch.equal(m.embed.weight, m.lm_head.weight.to(m.embed.weight.dtype)))
    return losses, norms, equal


@pytest.mark.parametrize("adam_every, bf16, rtol", [(1, False, 1e-6), (2, False, 1e-6), (1, True, 1e-3)])
def test_tying_as_data_trains_as_the_head_lookup_did(adam_every, bf16, rtol, one_thread):
    """Issue 33: the forward always reads the embedding, which the optimizers keep equal to the head while
    tied. Through the untie (step 3 of 6; with adam_every=2 Adam steps on 1, 3, 5 and the untie opens a
    window), with 2 micro-batches a step and clipping, the losses are the old code's (the head's rows
    looked up while tied, `old_tying`), and the embedding is the head, bit for bit, while tied. A bf16
    embedding (model.bf16_embeds) holds the head's values rounded, as the old lookup cast them, but its
    gradient is bf16 (the old lookup's was the fp32 head's): close, not equal (bf16 compute as on a GPU)."""
    cfg = apply_overrides(load_preset("tiny-cpu"), SMALL + ["--model.tie_embed_frac=0.5", "--model.smear=true",
                                                            f"--optim.adam_every={adam_every}",
                                                            f"--model.bf16_embeds={str(bf16).lower()}"])
    rt = runtime_for(cfg.model, "cpu", dtype=torch.bfloat16 if bf16 else torch.float32)
    new, new_norms, tied = train_through_untie(build_model(cfg.model, SEQ, rt, seed=0), cfg)
    old, old_norms, _ = train_through_untie(old_tying(build_model(cfg.model, SEQ, rt, seed=0)), cfg)
    np.testing.assert_allclose(new, old, rtol=rtol, atol=0)
    np.testing.assert_allclose(new_norms, old_norms, rtol=rtol, atol=0)
    assert new[-1] < new[0] and new[3:] != new[:3]
    assert tied[:3] == [True] * 3 and tied[3:] == [False] * 3  # untied at step 3: each its own update after


def test_old_checkpoints_load_with_the_switches_off_and_new_models_refuse_them_loudly():
    old = build().state_dict()
    build().load_state_dict(old)  # off: the same keys as before
    with pytest.raises(RuntimeError, match="bigram"):
        build(*SWITCHES["bigram"]).load_state_dict(old)


# ---------------------------------------------------------------------------------------------
# Untied value embeddings at more layers (record #63), mimetic V/O init (record #64)

def test_untied_value_embeddings_one_table_per_listed_layer():
    m = build(*SWITCHES["value_embed_layers"])
    assert len(m.value_embeds) == 3
    tables = ["a", "b", "c"]
    assert [m.value_embed_for_layer(tables, i) for i in range(4)] == ["a", "b", None, "c"]


def test_mimetic_vo_init_is_a_negative_identity_product_per_head():
    m = build(*SWITCHES["mimetic_vo"])
    attn = m.blocks[0].attn
    v, o = attn.qkv_w[2], attn.proj.weight  # (hdim, dim), (dim, hdim)
    prod = o @ v  # what a token's value does to the residual: ~ -beta I
    assert prod.diagonal().mean().item() == pytest.approx(-0.05, abs=0.01)
    off_diag = prod - torch.diag(prod.diagonal())
    assert off_diag.abs().mean() < 0.01
    q_off, q_on = build().blocks[0].attn.qkv_w[0], attn.qkv_w[0]
    assert torch.equal(q_off, q_on)  # q and k keep their init


# ---------------------------------------------------------------------------------------------
# KV cache: the look-backs see the previous call's last token

@pytest.mark.parametrize("extra", [["--model.smear=true", "--model.bigram_vocab_mult=2"],
                                   ["--model.tie_embed_frac=1.0", "--model.smear=true"]])
def test_kv_cache_matches_full_forward_with_lookback_switches(extra):
    cfg = cfg_with(*extra)
    m = build_model(cfg, 64, runtime_for(cfg, "cpu", window_block=8, windows=(64, 64)), seed=0)
    randomize(m)
    x = torch.randint(0, VOCAB, (1, 40))
    full = m(x)
    cache = KVCache(cfg.depth, 1, cfg.resolved_heads(), 64, cfg.head_dim, torch.device("cpu"), torch.float32)
    first = m(x[:, :25], kv_cache=cache)
    steps = [m(x[:, t:t + 1], kv_cache=cache) for t in range(25, 40)]
    assert torch.allclose(full, torch.cat([first] + steps, dim=1), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Config errors

@pytest.mark.parametrize("override, match", [
    ("--model.backout_layer=4", "backout_layer"),
    ("--model.tie_embed_frac=1.5", "tie_embed_frac"),
    ("--model.value_embed_layers=[0,0]", "value_embed_layers"),
    ("--model.bigram_vocab_mult=-1", "bigram_vocab_mult"),
    ("--model.mimetic_vo_beta=-1", "mimetic_vo_beta"),
])
def test_bad_values_are_config_errors(override, match):
    with pytest.raises(ConfigError, match=match):
        cfg_with(override)


def test_mimetic_needs_square_heads():
    with pytest.raises(ConfigError, match="mimetic"):
        cfg_with("--model.mimetic_vo_beta=0.05", "--model.num_kv_heads=2")
    assert math.isclose(cfg_with("--model.mimetic_vo_beta=0.05").mimetic_vo_beta, 0.05)


# ---------------------------------------------------------------------------------------------
# Through the training loop: every switch at once trains, and resume across the untie step is exact

ALL_ON = ["--model.bigram_vocab_mult=1", "--model.smear=true", "--model.value_embed_gates=true",
          "--model.skip_gates=true", "--model.backout_layer=2", "--model.logit_rescale=true",
          "--model.tie_embed_frac=0.5", "--model.value_embed_layers=[0,3]", "--model.mimetic_vo_beta=0.05"]


def test_training_with_every_switch_resumes_exactly_after_the_untie_step(tiny_cfg, tmp_path):
    from distkit import drop_checkpoints_after
    from speedgpt.train.loop import train

    cfg = apply_overrides(tiny_cfg, ALL_ON + ["--model.depth=4", "--model.attn_gate_dim=8", "--train.steps=8",
                                              "--train.checkpoint_every=3", "--train.keep_checkpoints=5",
                                              "--train.val_every=0", "--train.batch_tokens=256"])
    full = train(cfg, run_dir=tmp_path / "run", quiet=True)  # 8 steps: untied from step 4 on
    assert len(full.train_losses) == 8 and all(math.isfinite(x) for x in full.train_losses)
    assert full.train_losses[-1] < full.train_losses[0] - 1.0
    assert not full.model.embed_tied
    # Loading the finished run (eval, sampling) and its export gives the untied model too
    from speedgpt.export import export_model
    from speedgpt.infer.load import load_model

    x, _ = batch(B=1)
    for source in (tmp_path / "run", export_model(tmp_path / "run", tmp_path / "export", dtype="fp32")):
        loaded, _ = load_model(source, device="cpu")
        assert not loaded.embed_tied
        with torch.no_grad():
            assert torch.allclose(loaded(x), full.model.eval()(x), atol=1e-5)
    # From step 6: the checkpoint is untied (step 4 untied it), and the resumed run must stay so
    drop_checkpoints_after(tmp_path / "run", 6)
    resumed = train(cfg, run_dir=tmp_path / "run", resume=True, quiet=True)
    assert resumed.train_losses == full.train_losses[6:]  # bitwise on CPU
    assert resumed.val_loss == full.val_loss


def test_two_ranks_match_one_rank_with_every_switch(tmp_path, monkeypatch):
    """DistAdam shards the new parameters and the untie copies its sharded state: 2 gloo ranks give
    one rank's losses, 2 micro-steps a step (the untie at step 2 of 6 included). With Adam every other
    step (speedrun-latest's): while tied, the embedding's reduced slices join the head's, on the steps
    where they wait for Adam too."""
    import numpy as np
    from test_parallel_train import make_shards, run_cfg, run_here, run_two

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    on = [o for o in ALL_ON if not o.startswith(("--model.backout_layer", "--model.value_embed_layers"))]
    cfg = apply_overrides(run_cfg(make_shards(tmp_path / "data")),
                          on + ["--model.backout_layer=0", "--model.value_embed_layers=[0,1]",  # (1: the last block)
                                "--model.attn_gate_dim=8", "--train.checkpoint_every=0", "--optim.adam_every=2"])
    losses_two, val_two = run_two(cfg, tmp_path / "two", tmp_path)
    losses_one, val_one = run_here(cfg, tmp_path / "one")
    assert len(losses_one) == 6 and losses_one[-1] < losses_one[0] - 0.05
    np.testing.assert_allclose(losses_two, losses_one, rtol=2e-4, atol=0)
    np.testing.assert_allclose(val_two, val_one, rtol=2e-4)


def test_warmup_needs_no_step_at_the_untie(tiny_cfg):
    # Both tying phases are one graph (issue 33): an untie at step 95, past the spread's last step (90), is no
    # step of its own in the warmup (tests/test_compile_graphs.py pins that no recompile follows).
    from speedgpt.stages import stage_plan
    from speedgpt.train.warmup import warmup_steps

    cfg = apply_overrides(tiny_cfg, ["--model.tie_embed_frac=0.95", "--train.steps=100", "--train.warmup_steps=10"])
    assert warmup_steps(cfg, stage_plan(cfg)) == list(range(0, 100, 10))


def test_untie_into_a_bf16_embedding_keeps_training():
    """speedrun-latest has both: model.bf16_embeds and the untie. The head's fp32 Adam moments were copied
    as they were, and the first Adam step after the untie failed on the bf16 gradient (dtype mismatch)."""
    x, y = batch()
    cfg = apply_overrides(load_preset("tiny-cpu"), SMALL + ["--model.tie_embed_frac=0.5", "--model.bf16_embeds=true"])
    m = build_model(cfg.model, SEQ, "cpu", seed=0)
    assert m.embed.weight.dtype == torch.bfloat16 and m.lm_head.weight.dtype == torch.float32
    opt = build_optimizers(m, cfg.optim, torch.device("cpu"), world_size=1)
    for step in range(4):  # untied at step 2
        m.sync_embed_tying(step, 4, opt)
        m(x, y).backward()
        opt.step()
        opt.zero_grad()
    assert not m.embed_tied
    state = opt.adam.state[m.embed.weight]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    assert state["step"].dtype == torch.float32


def test_untie_into_a_bf16_embedding_on_two_ranks(tmp_path, monkeypatch):
    """DistAdam keeps each rank's slice of the moments as a flat shard: the untie must give those the
    bf16 embedding's dtype too, or the first Adam step after it fails on 2+ ranks (speedrun-latest on 8)."""
    import numpy as np
    from test_parallel_train import make_shards, run_cfg, run_here, run_two

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    cfg = apply_overrides(run_cfg(make_shards(tmp_path / "data")),
                          ["--model.tie_embed_frac=0.5", "--model.bf16_embeds=true", "--train.checkpoint_every=0"])
    losses_two, _ = run_two(cfg, tmp_path / "two", tmp_path)
    losses_one, _ = run_here(cfg, tmp_path / "one")
    assert len(losses_two) == len(losses_one) == 6 and all(np.isfinite(losses_two))
    np.testing.assert_allclose(losses_two, losses_one, rtol=2e-3, atol=0)
