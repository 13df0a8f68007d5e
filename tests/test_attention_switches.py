"""The later records' attention switches (model.key_offset, model.paired_head_layers, model.yarn):
shapes, initialization, their math against hand-built references, and that each changes the model
when on (off, tests/test_golden_losses.py pins the losses bit for bit)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from speedgpt.config import ConfigError, apply_overrides, load_preset
from speedgpt.data.tokenizer import BOS_ID
from speedgpt.model.attention import KVCache, build_context, pair_heads
from speedgpt.model.build import build_model
from speedgpt.model.rotary import Rotary
from speedgpt.model.runtime import runtime_for
from speedgpt.model.yarn import YarnSchedule, rescale, scale_factor
from speedgpt.plan import RunPlan, validate

pytestmark = pytest.mark.usefixtures("one_thread")

SWITCHES = {
    "key_offset": ["--model.key_offset=true"],
    "paired": ["--model.paired_head_layers=[0,2]"],
}


def model_cfg(*extra):
    return apply_overrides(load_preset("tiny-cpu"), ["--model.depth=4", "--model.model_dim=64", "--model.head_dim=16",
                                                     "--model.value_embeds=2", "--model.window_pattern=LS",
                                                     *extra]).model


def live(model):
    """Non-zero output projections and head: zero-initialized ones hide what attention computes."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.lm_head.weight.normal_(std=0.05, generator=g)
        for block in model.blocks:
            block.mlp.proj.weight.normal_(std=0.05, generator=g)
            if block.attn is not None:
                block.attn.proj.weight.normal_(std=0.05, generator=g)
    return model


def build(*extra, T=64, block=16, windows=(64, 32), seed=0, backend="sdpa"):
    cfg = model_cfg(*extra)
    rt = runtime_for(cfg, "cpu", window_block=block, windows=windows).replace(attn_backend=backend)
    return cfg, live(build_model(cfg, T, rt, seed=seed))


def tokens(B=2, T=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 50000, (B, T), generator=g)
    x[:, 0] = BOS_ID
    x[:, T // 2 + 3] = BOS_ID  # a second document, starting mid-block
    return x


# -- shared properties -----------------------------------------------------------------------------

@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_switch_adds_no_parameters_keeps_the_init_and_changes_the_output(switch):
    _, off = build()
    _, on = build(*SWITCHES[switch])
    assert off.state_dict().keys() == on.state_dict().keys()
    for name, t in off.state_dict().items():
        assert torch.equal(t, on.state_dict()[name]), name  # same seed: the same initial weights
    x = tokens()
    with torch.no_grad():
        a, b = off(x), on(x)
    assert a.shape == b.shape == (2, 64, 50304)
    assert not torch.allclose(a, b, atol=1e-4)  # the switch really changes what the model computes


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_switch_keeps_documents_isolated(switch):
    """Changing an earlier document's tokens must not change a later document's logits."""
    _, m = build(*SWITCHES[switch])
    x = tokens(B=1)
    x2 = x.clone()
    x2[0, 5:30] = 7
    with torch.no_grad():
        a, b = m(x), m(x2)
    start = 64 // 2 + 3
    assert torch.allclose(a[0, start:], b[0, start:], atol=1e-5)
    assert not torch.allclose(a[0, 30:start], b[0, 30:start], atol=1e-5)


@pytest.mark.parametrize("switch", sorted(SWITCHES) + ["yarn"])
def test_kv_cache_decoding_matches_the_full_forward(switch):
    extra = SWITCHES.get(switch, [])
    cfg, m = build(*extra, windows=(32, 16), block=8)
    rope = None
    if switch == "yarn":  # a grown state: frequencies and scale both differ from the tables'
        rope = m.rope_state(rescale(m.rotary.frequencies(), 16, 48), scale_factor(16, 48))
    x = tokens(B=1, T=40)
    x[0, 23] = 5  # one document: the cache path (sampling one prompt) has no document masks
    with torch.no_grad():
        full = m(x, rope=rope)
        cache = KVCache(cfg.depth, 1, cfg.resolved_heads(), 64, cfg.head_dim, torch.device("cpu"), torch.float32)
        first = m(x[:, :21], kv_cache=cache, rope=rope)
        steps = [m(x[:, t:t + 1], kv_cache=cache, rope=rope) for t in range(21, 40)]
    torch.testing.assert_close(torch.cat([first] + steps, dim=1), full, atol=1e-4, rtol=1e-4)


def test_flex_matches_sdpa_with_key_offset_and_paired_heads_on_cpu():
    pytest.importorskip("torch.nn.attention.flex_attention")
    extra = ["--model.key_offset=true", "--model.paired_head_layers=[1,2]"]
    _, m = build(*extra, T=128, block=32, windows=(64, 32))
    x = tokens(T=128)
    kw = dict(windows=(64, 32), doc_masking=True, bos_id=BOS_ID, patterns=m.mask_keys, block=32, doc_starts=True)
    assert set(m.mask_keys) == {"L", "S", "L2", "S2"}
    with torch.no_grad():  # flex has no CPU backward; forward equality is what this checks
        a = m(x, ctx=build_context(x, backend="sdpa", **kw))
        b = m(x, ctx=build_context(x, backend="flex", **kw))
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# -- partial key offset (record #49) --------------------------------------------------------------------

def test_key_offset_shifts_exactly_the_stationary_dims_within_documents():
    _, m = build("--model.key_offset=true")
    attn = m.blocks[0].attn
    assert attn.key_offset and m.blocks[0].window_key == "L"
    assert not m.blocks[1].attn.key_offset  # short-window layers keep their keys (record #49)
    k = torch.randn(2, 10, 4, 16)
    doc_start = torch.zeros(2, 10, dtype=torch.bool)
    doc_start[:, 0] = True
    doc_start[1, 6] = True
    out = attn.offset_keys(k, doc_start, None)
    still = Rotary(16, 8).stationary_dims()
    assert still.tolist() == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4
    torch.testing.assert_close(out[..., ~still], k[..., ~still], rtol=0, atol=0)  # rotated dims untouched
    torch.testing.assert_close(out[0, 1:][..., still], k[0, :-1][..., still], rtol=0, atol=0)  # from the previous token
    torch.testing.assert_close(out[:, 0], k[:, 0], rtol=0, atol=0)  # a sequence's first key keeps its own
    torch.testing.assert_close(out[1, 6], k[1, 6], rtol=0, atol=0)  # ... and so does a document's
    torch.testing.assert_close(out[1, 7][..., still], k[1, 6][..., still], rtol=0, atol=0)


def test_key_offset_needs_half_truncated_rotary():
    cfg = apply_overrides(load_preset("tiny-cpu"), ["--model.key_offset=true", "--model.rope_half_truncate=false"])
    with pytest.raises(ConfigError, match="rope_half_truncate"):
        validate(cfg)


# -- paired-head attention (record #58) -------------------------------------------------------------

def test_pair_heads_puts_head_h_and_h_plus_half_at_two_consecutive_positions():
    B, T, H, D = 2, 5, 6, 4
    x = torch.randn(B, T, H, D)
    y = pair_heads(x)
    assert y.shape == (B, 2 * T, H // 2, D)
    for t in range(T):
        for p in range(H // 2):
            assert torch.equal(y[:, 2 * t, p], x[:, t, p])
            assert torch.equal(y[:, 2 * t + 1, p], x[:, t, p + H // 2])
    assert torch.equal(y.reshape(B, T, H, D), x)  # the inverse


def test_paired_rotary_rotates_head_h_at_position_2t_plus_h_mod_2():
    """The record's YarnPairedHead: a (B, T, H/2, 2D) view whose first D dims rotate at 2t, last D at 2t + 1."""
    rot = Rotary(16, 64)
    rot.init_tables()
    x = torch.randn(1, 7, 6, 16)
    paired = rot(x, paired=True)
    plain = {j: rot(torch.zeros(1, 2 * 7, 6, 16).index_copy(1, torch.arange(j, 14, 2), x))[:, j::2] for j in (0, 1)}
    for h in range(6):
        torch.testing.assert_close(paired[:, :, h], plain[h % 2][:, :, h], rtol=0, atol=0)
    with_offset = rot(x[:, 3:], 3, paired=True)  # decoding from position 3 on: rotated at 2 (3 + t) + h mod 2
    torch.testing.assert_close(with_offset, paired[:, 3:], rtol=0, atol=0)


def test_paired_layer_matches_attention_over_the_interleaved_sequence():
    """A paired layer computed by hand: rotate, interleave the two heads of each pair into one causal
    sequence of 2T positions, attend, and put each head's output back."""
    cfg, m = build("--model.paired_head_layers=[0]", "--model.doc_masking=false", windows=(128, 128))
    attn = m.blocks[0].attn
    assert attn.paired and attn.mask_key == "L2" and not m.blocks[1].attn.paired
    assert m.rotary.max_seq_len == 64 and m.rotary.cos.size(0) == 128  # the context stays 64 tokens
    B, T, H, D = 2, 64, 4, 16
    x = torch.randn(B, T, 64)
    ctx = build_context(torch.zeros(B, T, dtype=torch.long), backend="sdpa", windows=(128, 128), doc_masking=False,
                        bos_id=BOS_ID, patterns=m.mask_keys)
    lam = torch.tensor([0.7, 0.0])
    with torch.no_grad():
        got = attn(x, None, lam, ctx)
        q, k, v = attn.qkv(x)
        q, k = F.rms_norm(q, (D,)), F.rms_norm(k, (D,))
        q, k = m.rotary(q, paired=True), m.rotary(k, paired=True)
        v = 0.7 * v
        inter = [torch.stack([t[:, :, :H // 2], t[:, :, H // 2:]], dim=2).reshape(B, 2 * T, H // 2, D).transpose(1, 2)
                 for t in (q, k, v)]
        y = F.scaled_dot_product_attention(*inter, is_causal=True, scale=attn.scale).transpose(1, 2)
        y = y.reshape(B, T, H * D)  # position 2t + j, pair p: head p + j H/2 of token t
        want = attn.proj(y)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("extra, match", [
    (["--model.paired_head_layers=[9]"], "outside"),
    (["--model.paired_head_layers=[1]", "--model.attn_free_layers=[1]"], "attention-free"),
    (["--model.paired_head_layers=[0]", "--model.num_heads=1", "--model.head_dim=128"], "even number of heads"),
    (["--model.paired_head_layers=[0]", "--model.num_kv_heads=2"], "grouped-query"),
])
def test_paired_head_config_errors(extra, match):
    with pytest.raises(ConfigError, match=match):
        validate(apply_overrides(load_preset("tiny-cpu"), extra))


# -- YaRN (record #31) ---------------------------------------------------------------------------------

def test_yarn_rescale_interpolates_slow_dims_keeps_fast_ones_and_scales_attention():
    freq = torch.tensor([2.0, 0.5, 0.05, 0.001, 0.0])
    old, new = 128, 256
    out = rescale(freq, old, new)
    turns = old * freq / (2 * math.pi)  # 40.7, 10.2, 1.02, 0.02, 0
    assert turns[0] > 32 and out[0] == freq[0]  # many turns over the old window: kept
    assert turns[3] < 1 and out[3] == pytest.approx(freq[3].item() * old / new)  # few: fully interpolated
    w = (turns[1].item() - 1) / 31  # in between: linear in the turns
    assert out[1].item() == pytest.approx(freq[1].item() * (0.5 + w * 0.5), rel=1e-6)
    assert out[4] == 0  # stationary dims stay stationary
    assert scale_factor(old, new) == pytest.approx(0.2 * math.log(2) + 1)


def test_yarn_schedule_compounds_over_the_window_changes_and_is_a_function_of_the_step():
    windows = {0: 64, 1: 64, 2: 128, 3: 128, 4: 256, 5: 256}
    base = Rotary(32, 1).frequencies()
    sched = YarnSchedule(base, lambda s: windows[s], 5)
    assert sched.change_steps == [0, 2, 4]
    assert sched.index(0) == sched.index(1) == 0 and sched.index(3) == 1 and sched.index(5) == 2
    assert torch.equal(sched.state(1)[0], base) and sched.state(1)[1] == 1.0
    f2, s2 = sched.state(5)
    torch.testing.assert_close(f2, rescale(rescale(base, 64, 128), 128, 256), rtol=0, atol=0)
    assert s2 == pytest.approx(scale_factor(64, 128) * scale_factor(128, 256))


def test_yarn_at_its_initial_state_is_the_plain_model_and_a_grown_state_changes_it():
    _, m = build()
    x = tokens()
    base = m.rope_state(m.rotary.frequencies(), 1.0)
    grown = m.rope_state(rescale(m.rotary.frequencies(), 16, 64), scale_factor(16, 64))
    with torch.no_grad():
        plain, same, changed = m(x), m(x, rope=base), m(x, rope=grown)
    assert torch.equal(plain, same)  # the state's tables are computed as the model's own: bit for bit
    assert not torch.allclose(plain, changed, atol=1e-4)


def test_yarn_state_and_window_changes_do_not_recompile_with_every_switch_on():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    _, m = build("--model.key_offset=true", "--model.paired_head_layers=[1]")
    x = tokens(B=1)
    compiled = torch.compile(m, backend="aot_eager", dynamic=False)
    freq = m.rotary.frequencies()
    states = [((32, 16), freq, 1.0), ((48, 16), rescale(freq, 32, 48), 1.1), ((64, 32), rescale(freq, 32, 64), 1.3)]
    losses = [compiled(x, x, windows=torch.tensor(w, dtype=torch.int32), rope=m.rope_state(f, s)).item()
              for w, f, s in states]
    assert counters["stats"]["unique_graphs"] == 1
    assert len(set(losses)) == 3


def test_blocks_get_the_rows_rotation_not_the_yarn_states_whole_tables():
    """The context a block receives holds the row's rotation and YaRN's query scale, never the state's whole tables
    (2 x 128 MiB for speedrun-latest): a sharded block's floating inputs are cast to the compute dtype on every call
    (FSDP2's mixed precision), so whole tables there would be copied by every block of every forward."""
    from dataclasses import fields

    _, m = build("--model.paired_head_layers=[1]")
    x = tokens(B=1, T=40)
    contexts = []
    for block in m.blocks:
        block.register_forward_pre_hook(lambda _mod, args: contexts.append(args[5]))
    state = m.rope_state(rescale(m.rotary.frequencies(), 16, 64), scale_factor(16, 64))
    with torch.no_grad():
        m(x, rope=state)
    assert len(contexts) == len(m.blocks)
    tables = {state.cos.untyped_storage().data_ptr(), state.sin.untyped_storage().data_ptr()}

    def tensors(v):
        if isinstance(v, torch.Tensor):
            return [v]
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (tuple, list)) else ()
        return [t for item in items for t in tensors(item)]

    for ctx in contexts:
        held = [t for f in fields(ctx) for t in tensors(getattr(ctx, f.name))]
        positions = {t.numel() // (m.rotary.head_dim // 2) for pair in ctx.rotary_tables.values() for t in pair}
        assert positions == {40, 80}  # unpaired and paired layers' rotations: T and 2T positions
        from_tables = [t for t in held if t.untyped_storage().data_ptr() in tables]
        assert len(from_tables) == 4 and all(t.numel() <= 80 * m.rotary.head_dim // 2 for t in from_tables), \
            [tuple(t.shape) for t in from_tables]
        assert ctx.q_scale.item() == pytest.approx(scale_factor(16, 64))


def test_the_compiled_graph_of_a_yarn_model_computes_no_cos_or_sin():
    """YaRN's tables enter the graph as data (model/rotary.py): a cos or sin in it is fused into every rotary
    kernel by Inductor, each element's own, and made speedrun-latest's slowest kernels take 10-13 s to build."""
    torch._dynamo.reset()
    _, m = build("--model.key_offset=true", "--model.paired_head_layers=[1]")
    graphs = []

    def keep_graph(gm, _example_inputs):
        graphs.append(gm)
        return gm.forward

    x = tokens(B=1)
    freq = rescale(m.rotary.frequencies(), 32, 64)
    compiled = torch.compile(m, backend=keep_graph, dynamic=False)
    compiled(x, x, windows=torch.tensor((64, 32), dtype=torch.int32), rope=m.rope_state(freq, 1.3))
    assert len(graphs) == 1
    calls = [n.target for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    trig = [t for t in calls if getattr(t, "__name__", t) in ("cos", "sin", "cos_", "sin_")]
    assert calls and not trig, trig


def test_training_validation_and_eval_use_the_yarn_state_of_the_scored_step(tiny_cfg, tmp_path):
    """model.yarn in a run whose window grows: the step-4 validation scores the step-4 state, and
    `speedgpt eval` of the step-4 checkpoint (its runtime default) finds the same state."""
    from speedgpt.eval.run import evaluate_run
    from speedgpt.infer.load import load_model
    from speedgpt.train.loop import train

    cfg = apply_overrides(tiny_cfg, ["--train.steps=8", "--train.val_every=4", "--train.checkpoint_every=4",
                                     "--train.keep_checkpoints=10", "--schedule.window_start=16",
                                     "--schedule.window_end=64", "--model.yarn=true", f"--run.dir={tmp_path / 'run'}"])
    result = train(cfg, quiet=True)
    sched = RunPlan.of(cfg).yarn
    assert sched.index(4) > 0 and sched.index(8) > sched.index(4)  # the state really moves during the run
    model, _ = load_model(tmp_path / "run", checkpoint=4, device="cpu")
    freq, scale = sched.state(4)
    assert model.runtime.yarn == (tuple(freq.tolist()), scale)
    rec = evaluate_run(tmp_path / "run", checkpoint=4, device="cpu", log=False, print_fn=lambda *a: None)
    assert dict(result.val_history)[4] == pytest.approx(rec["val_loss"], rel=2e-7)


def test_kv_cache_sampling_reads_the_yarn_state_from_the_device_and_samples_as_before():
    """A model whose runtime carries a grown YaRN state (a checkpoint's, for eval and sampling) keeps it
    on its device: every decode step hands the attention the same tensors (no host-to-device copy per
    token), and the tokens are those of the full-forward reference and of fresh tensors per call."""
    from speedgpt.infer.generate import generate_batch

    cfg = model_cfg("--model.yarn=true")
    freq, scale = rescale(Rotary(cfg.head_dim, 1, cfg.rope_base, cfg.rope_half_truncate).frequencies(), 16, 48), \
        scale_factor(16, 48)
    rt = runtime_for(cfg, "cpu", window_block=16, windows=(64, 32)).replace(yarn=(tuple(freq.tolist()), scale))
    m = live(build_model(cfg, 64, rt, seed=0))
    seen = []  # each call's AttnContext: the rotation its layers read and YaRN's query scale
    m.blocks[0].register_forward_pre_hook(
        lambda _mod, args: seen.append((args[5].rotary_tables[False], args[5].q_scale)))
    prompts = [[BOS_ID, 11, 12, 13], [BOS_ID, 21]]
    cached = generate_batch(m, prompts, 12, temperature=1.0, top_k=50, seed=3, stop_token=None)
    # views of the model's own tables and its scale buffer, every call: nothing made or copied per token
    assert len(seen) > 10 and all(c._base is m.rotary.cos and s._base is m.rotary.sin and q is m.yarn_scale
                                  for (c, s), q in seen)
    cos, sin = m.rotary.tables(freq)
    assert torch.equal(m.rotary.cos, cos) and torch.equal(m.rotary.sin, sin)
    assert m.yarn_scale.item() == torch.tensor(scale, dtype=torch.float32).item()
    assert cached == generate_batch(m, prompts, 12, temperature=1.0, top_k=50, seed=3, stop_token=None,
                                    use_cache=False)
    x = tokens(B=2, T=40)
    with torch.no_grad():  # the state given as fresh tensors, as forward built it per call before
        fresh = m(x, rope=m.rope_state(rt.yarn[0], scale))
        assert torch.equal(m(x), fresh)
