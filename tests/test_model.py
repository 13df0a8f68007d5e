import math

import pytest
import torch

from speedgpt.config import apply_overrides, load_preset
from speedgpt.model.attention import build_context, dense_mask, document_ids
from speedgpt.data.tokenizer import BOS_ID
from speedgpt.model.build import build_model
from speedgpt.model.runtime import runtime_for


def tiny_model_cfg(*extra):
    return apply_overrides(load_preset("tiny-cpu"), ["--model.depth=4", "--model.model_dim=64", "--model.head_dim=16",
                                                     "--model.value_embeds=2", *extra]).model


def batch(B=2, T=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 50257, (B, T), generator=g)
    x[:, 0] = BOS_ID
    x[:, T // 2] = BOS_ID
    y = torch.randint(0, 50257, (B, T), generator=g)
    return x, y


def test_shapes_and_initial_loss_is_uniform():
    m = build_model(tiny_model_cfg(), 32, "cpu", seed=0)
    x, y = batch()
    logits = m(x)
    assert logits.shape == (2, 32, 50304)
    loss = m(x, y)
    assert loss.item() == pytest.approx(math.log(50304), abs=1e-4)  # zero-init head: uniform over padded vocab
    per_token = m(x, y, reduction="none")
    assert per_token.shape == (2, 32)


def test_seeded_init_is_deterministic_and_nonzero_where_expected():
    a = build_model(tiny_model_cfg(), 32, "cpu", seed=3)
    b = build_model(tiny_model_cfg(), 32, "cpu", seed=3)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    assert a.blocks[0].attn.qkv_w.std() > 0
    assert a.blocks[0].attn.proj.weight.abs().sum() == 0  # zero-init output projections
    assert a.blocks[0].mlp.proj.weight.abs().sum() == 0


def test_value_embeddings_are_used_u_shaped():
    m = build_model(tiny_model_cfg("--model.depth=6", "--model.value_embeds=2"), 32, "cpu")
    ves = ["ve0", "ve1"]
    assert [m.value_embed_for_layer(ves, i) for i in range(6)] == ["ve0", "ve1", None, None, "ve0", "ve1"]


def test_every_parameter_gets_a_gradient_after_one_step():
    cfg = tiny_model_cfg("--model.attn_gate=true", "--model.attn_gate_dim=8", "--model.attn_free_layers=[2]")
    m = build_model(cfg, 32, "cpu", seed=0)
    torch.nn.init.normal_(m.lm_head.weight, std=0.02)  # zero head would block gradients to the body
    for block in m.blocks:
        torch.nn.init.normal_(block.mlp.proj.weight, std=0.02)
        if block.attn is not None:
            torch.nn.init.normal_(block.attn.proj.weight, std=0.02)
    x, y = batch()
    m(x, y).backward()
    groups = m.param_groups()
    grouped = [p for ps in groups.values() for p in ps]
    assert len(grouped) == len(list(m.parameters()))  # every parameter has exactly one optimizer role
    missing = [n for n, p in m.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert missing == []
    assert m.blocks[2].attn is None


def test_document_masking_isolates_documents():
    """Changing tokens of an earlier document must not change logits of a later one."""
    m = build_model(tiny_model_cfg(), 32, "cpu", seed=0)
    torch.nn.init.normal_(m.lm_head.weight, std=0.02)
    for block in m.blocks:
        torch.nn.init.normal_(block.attn.proj.weight, std=0.02)
    x, _ = batch(B=1)
    x2 = x.clone()
    x2[0, 3:10] = 7
    a, b = m(x), m(x2)
    assert torch.allclose(a[0, 16:], b[0, 16:], atol=1e-5)
    assert not torch.allclose(a[0, 10:16], b[0, 10:16], atol=1e-5)


def test_dense_mask_semantics():
    x = torch.tensor([[BOS_ID, 1, 2, BOS_ID, 3, 4]])
    doc = document_ids(x, BOS_ID)
    # blocks of 2 tokens, a window of 2 blocks: a query sees its own block and the one before
    mask = dense_mask(doc, 6, window=4, block=2, device=torch.device("cpu"))[0, 0]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_flex_reference_matches_sdpa_on_cpu():
    """The FlexAttention path (run unfused on CPU) computes the same attention as the SDPA dense path."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    cfg = tiny_model_cfg("--model.window_pattern=LS")
    m = build_model(cfg, 256, runtime_for(cfg, "cpu", window_block=32), seed=0)
    torch.nn.init.normal_(m.lm_head.weight, std=0.02)
    for block in m.blocks:
        torch.nn.init.normal_(block.attn.proj.weight, std=0.02)
    x, y = batch(B=2, T=256)
    x[0, 40] = BOS_ID  # documents starting mid-block
    x[1, 200] = BOS_ID
    windows = (128, 64)
    kw = dict(windows=windows, doc_masking=True, bos_id=BOS_ID, patterns="LS", block=32)
    ctx_sdpa = build_context(x, backend="sdpa", **kw)
    ctx_flex = build_context(x, backend="flex", **kw)
    with torch.no_grad():  # flex has no CPU backward; forward equality is what this checks
        a = m(x, y, reduction="none", windows=windows, ctx=ctx_sdpa)
        b = m(x, y, reduction="none", windows=windows, ctx=ctx_flex)
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def assert_lists_equal_within_counts(count, lists, ref_count, ref_lists) -> int:
    """Block lists as the flex kernels read them: equal counts, equal entries within each count (order included);
    past a count, any valid block index. Returns the entries compared."""
    assert count.dtype == ref_count.dtype == lists.dtype == ref_lists.dtype == torch.int32
    assert torch.equal(count, ref_count) and lists.shape == ref_lists.shape
    assert bool(((lists >= 0) & (lists < lists.size(-1))).all())
    within = torch.arange(lists.size(-1)) < count[..., None]
    assert torch.equal(torch.where(within, lists, -1), torch.where(within, ref_lists, -1))
    return int(count.sum())


def random_document_layouts(block: int, blocks: int, trials: int):
    """Document ids of 3 rows per trial (and the doubled, paired-head sequence): no document boundary at all,
    sparse to dense random starts (one-token documents, several in one block), starts on block boundaries."""
    g = torch.Generator().manual_seed(0)
    for trial in range(trials):
        x = torch.randint(0, 50000, (3, block * blocks), generator=g)
        x[torch.rand(x.shape, generator=g) < (0.0, 0.002, 0.01, 0.05, 0.3)[trial % 5]] = BOS_ID
        if trial % 2:
            x[1, ::block] = BOS_ID
        x[:, 0] = BOS_ID
        doc = document_ids(x, BOS_ID)
        yield doc
        yield doc.repeat_interleave(2, dim=1)


def test_flex_key_side_lists_equal_a_sort():
    """FlexMasks' key-block lists (nearest first, built without a sort) equal a stable descending argsort of the
    dense block masks within each count (what the kernels read), on random document layouts."""
    from speedgpt.model.attention import FlexMasks

    def sorted_lists(dense):  # the lists by a sort, as FlexMasks built them before
        order = dense.to(torch.int8).argsort(dim=-1, descending=False, stable=True).flip(-1)
        return dense.sum(dim=-1, dtype=torch.int32)[:, None], order.to(torch.int32)[:, None]

    block, listed = 16, 0
    for d in random_document_layouts(block, 24, trials=40):
        masks = FlexMasks(d, block)
        nb = d.size(1) // block
        first, last = d.view(3, nb, block)[:, :, 0], d.view(3, nb, block)[:, :, -1]
        idx = torch.arange(nb)
        full = (idx[:, None] > idx[None, :]) & (first[:, :, None] == last[:, None, :]) & (
            last[:, :, None] == first[:, None, :])
        partial = (idx[:, None] >= idx[None, :]) & (first[:, :, None] <= last[:, None, :]) & (
            last[:, :, None] >= first[:, None, :]) & ~full
        listed += assert_lists_equal_within_counts(masks.partial_n, masks.partial_idx, *sorted_lists(partial))
        listed += assert_lists_equal_within_counts(masks.full_n, masks.full_idx, *sorted_lists(full))
    assert listed > 10_000


def test_flex_masks_query_side_lists_are_flex_own():
    """FlexMasks builds each mask's query-side block lists (the backward's) itself, without from_kv_blocks' vmap
    (issue 33: dynamo's trace), scatter or sort: they equal what BlockMask.from_kv_blocks computes from the same
    key-side lists within each count, on random document layouts (paired-head sequences too), for windows of one
    block, a few, more than a document and the whole row, and 0-d tensor windows (YaRN's schedule); without grad
    (validation) there are none."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import BlockMask

    from speedgpt.model.attention import FlexMasks

    block, checked, listed = 16, 0, 0
    for d in random_document_layouts(block, 24, trials=10):
        masks = FlexMasks(d, block)
        for window in (16, 48, 100, 1024, torch.tensor(80)):
            ours = masks.block_mask(window)
            flex = BlockMask.from_kv_blocks(ours.kv_num_blocks, ours.kv_indices, ours.full_kv_num_blocks,
                                            ours.full_kv_indices, BLOCK_SIZE=block, mask_mod=ours.mask_mod)
            assert ours.seq_lengths == flex.seq_lengths and ours.BLOCK_SIZE == flex.BLOCK_SIZE
            listed += assert_lists_equal_within_counts(ours.q_num_blocks, ours.q_indices, flex.q_num_blocks,
                                                       flex.q_indices)
            listed += assert_lists_equal_within_counts(ours.full_q_num_blocks, ours.full_q_indices,
                                                       flex.full_q_num_blocks, flex.full_q_indices)
            checked += 1
            with torch.no_grad():
                assert masks.block_mask(window).q_indices is None
    assert checked == 100 and listed > 10_000


def test_kv_cache_matches_full_forward():
    from speedgpt.model.attention import KVCache

    cfg = tiny_model_cfg("--model.attn_free_layers=[1]")
    # two-block windows: the cache path must drop keys that slid out
    m = build_model(cfg, 64, runtime_for(cfg, "cpu", window_block=8, windows=(16, 16)), seed=0)
    torch.nn.init.normal_(m.lm_head.weight, std=0.02)
    for block in m.blocks:
        torch.nn.init.normal_(block.mlp.proj.weight, std=0.02)
        if block.attn is not None:
            torch.nn.init.normal_(block.attn.proj.weight, std=0.02)
    x = torch.randint(0, 50000, (1, 40))
    x[0, 0] = BOS_ID
    full = m(x)
    cache = KVCache(cfg.depth, 1, cfg.resolved_heads(), 64, cfg.head_dim, torch.device("cpu"), torch.float32)
    first = m(x[:, :25], kv_cache=cache)
    steps = [m(x[:, t:t + 1], kv_cache=cache) for t in range(25, 40)]
    inc = torch.cat([first] + steps, dim=1)
    assert torch.allclose(full, inc, atol=1e-4)


def test_flex_falls_back_to_dense_masks_for_partial_blocks():
    """Sampling without cache and HellaSwag rows have any length; flex needs whole blocks."""
    cfg = tiny_model_cfg()
    runtime = runtime_for(cfg, "cpu", window_block=32)
    m = build_model(cfg, 128, runtime, seed=0)
    torch.nn.init.normal_(m.lm_head.weight, std=0.02)
    m_flex = build_model(cfg, 128, runtime.replace(attn_backend="flex"), seed=0)
    m_flex.load_state_dict(m.state_dict())
    x, y = batch(B=1, T=87)
    with torch.no_grad():
        dense = m(x, y, reduction="none")
        fallback = m_flex(x, y, reduction="none")
    assert torch.equal(dense, fallback)


def test_window_schedule_does_not_recompile():
    """Windows enter the compiled model as tensors: a new window size must reuse the graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = tiny_model_cfg("--model.window_pattern=LS")
    m = build_model(cfg, 64, runtime_for(cfg, "cpu", window_block=16), seed=0)
    x, y = batch(B=1, T=64)
    compiled = torch.compile(m, backend="aot_eager", dynamic=False)
    losses = [compiled(x, y, windows=torch.tensor(w, dtype=torch.int32)).item() for w in ((16, 16), (48, 32), (64, 16))]
    assert counters["stats"]["unique_graphs"] == 1
    assert losses[0] == pytest.approx(m(x, y, windows=(16, 16)).item(), abs=1e-5)


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    """parallel.activation_checkpointing recomputes each block in the backward: same numbers, and an
    MoE layer counts its tokens once (not again in the recomputation)."""
    from speedgpt.config import ModelConfig

    cfg = ModelConfig(depth=3, model_dim=64, head_dim=16, value_embeds=1, vocab_size=256, moe_experts=4)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    results = []
    for ac in (False, True):
        model = build_model(cfg, 32, runtime_for(cfg, "cpu").replace(activation_checkpointing=ac))
        with torch.no_grad():
            model.lm_head.weight.normal_(generator=torch.Generator().manual_seed(1))  # zero init: most grads zero
        loss = model(x, x)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()},
                        model.blocks[1].mlp.load.clone()))
    (l0, g0, load0), (l1, g1, load1) = results
    assert torch.equal(l0, l1)
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=0, msg=name)
    assert load0.sum() == 2 * 32 * 2 and torch.equal(load0, load1)  # tokens x top_k, counted once


@pytest.mark.parametrize("scope", ["model", "block"])
def test_checkpointed_blocks_read_the_rotary_tables_without_breaking_the_compile(scope):
    """The rotary tables every layer reads (AttnContext.rotary_tables) are made by GPT.forward before the blocks.
    Filled by a block's first use instead, they broke activation checkpointing's recompute under per-block compile
    (CheckpointError: the recomputed block took another graph) and broke a whole-model graph (dynamo refuses side
    effects inside its checkpoint operator). Paired and unpaired layers, YaRN on: one graph and no break as a whole
    model; per block, no break and the graphs of the same model without checkpointing; the loss and gradients
    those of the uncompiled model without checkpointing."""
    from torch._dynamo.utils import counters

    from speedgpt.config import load_preset
    from speedgpt.model.runtime import resolve_runtime
    from speedgpt.train.compile import compile_blocks

    cfg = apply_overrides(load_preset("tiny-cpu"), [
        "--model.depth=4", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
        "--model.paired_head_layers=[1, 2]", "--model.yarn=true", "--model.key_offset=true", "--data.seq_len=32"])
    rt = resolve_runtime(cfg, "cpu")
    x, y = batch(B=1, T=32)

    def train_step(checkpointed: bool, compile_scope: str | None):
        model = build_model(cfg.model, 32, rt.replace(activation_checkpointing=checkpointed), seed=0)
        torch.nn.init.normal_(model.lm_head.weight, std=0.02, generator=torch.Generator().manual_seed(1))  # not 0
        torch._dynamo.reset()
        counters.clear()
        try:
            forward = model
            if compile_scope == "model":
                forward = torch.compile(model, backend="aot_eager", dynamic=False)
            elif compile_scope == "block":
                compile_blocks(model, backend="aot_eager")
            loss = forward(x, y)
            loss.backward()
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            return loss.detach(), grads, counters["stats"]["unique_graphs"], dict(counters["graph_break"])
        finally:
            torch._dynamo.reset()

    ref_loss, ref_grads, _, _ = train_step(False, None)
    *_, plain_graphs, _ = train_step(False, scope)
    loss, grads, graphs, breaks = train_step(True, scope)
    assert breaks == {}
    assert graphs == (1 if scope == "model" else plain_graphs)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


def test_masks_of_several_rows_are_built_outside_the_compiled_graph():
    """B > 1: the flex masks are built eagerly, not traced into the graph that Inductor compiles (a
    whole-model graph that built them faulted on the GPU, attention.build_context_eagerly); B = 1
    keeps them in the graph. Compiled and eager losses agree either way."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    cfg = tiny_model_cfg("--model.window_pattern=LS")
    m = build_model(cfg, 64, runtime_for(cfg, "cpu", window_block=32).replace(attn_backend="flex"), seed=0)
    torch.nn.init.normal_(m.lm_head.weight, std=0.02)
    for B, traced in ((1, True), (2, False)):
        x, y = batch(B=B, T=64)
        x[:, 20] = BOS_ID
        with torch.no_grad():
            eager = m(x, y, reduction="none")
            torch._dynamo.reset()
            explained = torch._dynamo.explain(m)(x, y, reduction="none")
            compiled = torch.compile(m, backend="eager")(x, y, reduction="none")
        # the masks start from the document ids (a cumsum): a cumsum in a graph means they were traced
        ops = [str(n.target) for g in explained.graphs for n in g.graph.nodes]
        assert any("cumsum" in op for op in ops) == traced, B
        assert torch.allclose(eager, compiled, atol=1e-5)
