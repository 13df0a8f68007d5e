"""What torch.compile builds for each GPU preset, pinned (train/compile_watch.py): the preset's architecture and
stage table scaled down, compiled by dynamo with the eager backend (it captures and guards the same graphs as
Inductor, without generating code), through the trainer's real compile warmup. A change that adds a graph or
a recompile fails here, with the recompile's reason in the message; a change that removes one updates the pin.
Attention runs on SDPA here (flex has no CPU backward); flex's own path on the GPU is checked below with its
CUDA branch run on CPU (flex_as_on_a_gpu)."""

from __future__ import annotations

import logging

import pytest
import torch
from test_compile_breakdown import check_breakdown
from torch._dynamo.utils import counters

from speedgpt.config import apply_overrides, load_preset
from speedgpt.train.compile_watch import AFTER_WARMUP, VALIDATION_AFTER_WARMUP, CompileWatch, recompile_reason
from speedgpt.train.loop import Trainer

# (span, graphs, recompile reasons) per preset, at this commit. moe-d12 (on its CUDA path, `cuda_moe_path`): one
# training graph, its MoE layers in it (issue 34: a graph break per MoE layer had each block recompiled per
# variant and grad mode past dynamo's limit); its rows > 1 build the masks eagerly (a graph break by design,
# model.context), so validation recompiles three frames. speedrun-latest: one training graph, its stages in rows of
# one shape (1 x 32K): stage 1's 2 MTP weights padded to 3, stage 2's next-token loss as weights (1, 0, 0)
# (step_schedule.py; in its earlier rows, 2 x 16K then 1 x 48K, stage 2 compiled a second graph); its untie of the
# embedding is data, no graph (it was a Python flag the graph guarded on: `self.embed_tied == True`, one more
# graph); validation runs without grad (a global-state guard).
PINNED = {
    "speedrun-latest": [("stage 0", 1, []),
                        ("stage 1", 0, []),
                        ("stage 2", 0, []),
                        ("validation", 1, ["GLOBAL_STATE changed: grad_mode"])],
    "speedrun-124m": [("training", 1, []), ("validation", 1, ["GLOBAL_STATE changed: grad_mode"])],
    "moe-d12": [("training", 1, []), ("validation", 1, ["GLOBAL_STATE changed: grad_mode"] * 3)],
}


def scaled_preset(name: str, shards) -> object:
    """`name` at depth 4 and width 64, its rows, batches and windows / 1024 (documents / 64; rows of 48 for presets
    whose rows are shorter than 16K), its layer lists on 4 layers, the same steps (so stage starts and the untie step
    keep their places)."""
    cfg = load_preset(name)
    m = cfg.model
    rows = cfg.data.seq_len // 1024 if cfg.data.seq_len >= 16384 else 48
    ov = ["--model.depth=4", "--model.model_dim=64", "--model.head_dim=16", "--model.window_pattern=LSSL",
          "--model.attn_backend=sdpa", "--train.device=cpu", "--train.compile=true", "--train.compile_backend=eager",
          f"--data.seq_len={rows}", "--data.val_seq_len=256", "--data.val_tokens=512",
          "--train.batch_tokens=96", "--schedule.window_block=16", "--schedule.window_start=16",
          "--schedule.window_end=224", "--run.report=false", "--run.sample_tokens=0", f"--data.train_files={shards}"]
    ov += ["--model.attn_free_layers=[2]"] if m.attn_free_layers else []
    ov += ["--model.value_embeds=1"] if m.value_embeds else []
    ov += ["--model.value_embed_layers=[0, 3]"] if m.value_embed_layers else []
    ov += ["--model.paired_head_layers=[1]"] if m.paired_head_layers else []
    ov += ["--model.backout_layer=2"] if m.backout_layer >= 0 else []
    ov += ["--train.micro_batch_size=2"] if cfg.train.micro_batch_size > 2 else []  # the scaled step has 2 rows
    cfg = apply_overrides(cfg, ov)
    for s in cfg.train.stages:
        s.batch_tokens, s.seq_len, s.max_doc_len = s.batch_tokens // 2048, s.seq_len // 1024, s.max_doc_len // 64
    return cfg


def cuda_moe_path(cfg, monkeypatch):
    """An MoE preset's experts as on the GPU: dispatched by torch._grouped_mm (runtime.moe_grouped, CUDA's
    choice) in bf16 (the only dtype it compiles in); 1 warmup step, not the preset's 10 (15 s on the CPU)."""
    from speedgpt.model import runtime

    for_device = runtime.runtime_for
    monkeypatch.setattr(runtime, "runtime_for", lambda *a, **kw: for_device(*a, **kw).replace(moe_grouped=True))
    return apply_overrides(cfg, ["--train.dtype=bfloat16", "--train.warmup_steps=1"])


@pytest.mark.parametrize("preset", sorted(PINNED))
def test_each_presets_graphs_are_pinned(preset, text_shards, tmp_path, one_thread, monkeypatch):
    torch._dynamo.reset()
    try:
        cfg = scaled_preset(preset, text_shards)
        if cfg.model.moe_experts:
            cfg = cuda_moe_path(cfg, monkeypatch)
        tr = Trainer(cfg, run_dir=tmp_path / "run", quiet=True)
        tr.setup()
        tr.warmup_then_reset()
        tr.compile_watch.close()
        got = [(s.label, s.graphs, [r.split(": ", 1)[1] for r in s.recompiles]) for s in tr.compile_watch.spans]
        assert got == PINNED[preset], "\n".join(tr.compile_watch.lines())
        # where each span's compile time went (compile_breakdown.py): every phase present, none negative, their
        # sum within the span's compile time; validation's apart from training's
        for span in [*tr.compile_watch.spans, tr.compile_watch.total()]:
            check_breakdown(span.breakdown(), span.wall_s)
        assert tr.compile_watch.spans[-1].breakdown()["compile_s"] > 0  # validation's own graph
    finally:
        torch._dynamo.reset()


# speedrun-124m's validation (3 rows in batches of 2) ends in a short batch, a second shape the warmup must meet;
# speedrun-latest's rows in a micro-step (1 a micro-step, as the preset's 32K rows) leave it batches of 1 row.
@pytest.mark.parametrize("preset,rows", [("speedrun-124m", 2), ("speedrun-latest", 1)])
def test_nothing_compiles_after_the_presets_warmup(preset, rows, text_shards, tmp_path, one_thread):
    """The presets warm up on step 0 and each stage's first step alone (train.warmup_steps=1), and validation on
    one batch of each shape: a whole (shortened) run after it, windows growing, YaRN, the MTP weights' decay,
    the untie and validations every 10 steps, compiles no graph, in training or in validation."""
    torch._dynamo.reset()
    try:
        cfg = apply_overrides(scaled_preset(preset, text_shards),
                              ["--train.steps=40", "--train.val_every=10", "--data.val_tokens=768",
                               f"--train.micro_batch_size={rows}", "--train.checkpoint_every=0",
                               "--train.save_final_checkpoint=false"])
        assert cfg.train.warmup_steps == 1  # the preset's own
        tr = Trainer(cfg, run_dir=tmp_path / "run", quiet=True)
        result = tr.run()
        spans = {s.label: s for s in tr.compile_watch.spans}
        assert len(result.val_history) == 5 and spans["validation"].graphs == rows, "\n".join(tr.compile_watch.lines())
        late = {s.label: s.frames for s in tr.compile_watch.spans if s.label.endswith("after the warmup")}
        assert late == {AFTER_WARMUP: 0, VALIDATION_AFTER_WARMUP: 0}, "\n".join(tr.compile_watch.lines())
    finally:
        torch._dynamo.reset()


# compile_scope=block, one training step: graphs per preset (scaled_preset's 4 blocks), one per distinct block
# (each a recompile of Block.forward; the rest of the model runs eagerly). Both presets: every block differs,
# block 3 from block 0 too (block 0's x is x0, an aliasing guard); 124m: (L, value embedding), S, attention-free,
# L; latest: (L, gated value embedding, key offset), (S, paired heads), attention-free, L.
BLOCK_VARIANTS = {"speedrun-124m": 4, "speedrun-latest": 4}


class _LimitHits(logging.Handler):
    """dynamo's warning when a frame passes its recompile limit (it then runs that frame eagerly)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "recompile_limit" in record.getMessage():
            self.hits.append(record.getMessage().splitlines()[0])


@pytest.mark.parametrize("preset", sorted(BLOCK_VARIANTS))
def test_block_scope_compiles_every_block_variant(preset, text_shards, tmp_path, one_thread):
    """Issue 33: the 12-block presets have more block variants than dynamo's recompile limit (8), and the
    blocks past it ran eagerly on the GPU. Here 4 blocks are 4 variants, so the global limit goes down to
    2 to put them in the same state: every variant must still compile (compile_blocks' own limit)."""
    torch._dynamo.reset()
    counters.clear()  # reset() keeps them
    hits = _LimitHits()
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(hits)
    try:
        cfg = apply_overrides(scaled_preset(preset, text_shards), ["--train.compile_scope=block"])
        with torch._dynamo.config.patch(recompile_limit=2):
            tr = Trainer(cfg, run_dir=tmp_path / "run", quiet=True)
            tr.setup()
            with tr.compile_watch.span("step"):
                tr.train_step(0)
            tr.compile_watch.close()
        assert hits.hits == [], "\n".join(tr.compile_watch.lines())
        assert not counters["unimplemented"], dict(counters["unimplemented"])
        assert tr.compile_watch.total().graphs == BLOCK_VARIANTS[preset], "\n".join(tr.compile_watch.lines())
    finally:
        logger.removeHandler(hits)
        torch._dynamo.reset()


class _Variant(torch.nn.Module):
    """Modules of one code object whose Python attribute picks the branch: what the blocks of a model are."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x + self.k


@pytest.mark.parametrize("native", [True, False], ids=["torch.compile's limit", "patched limit (older torch)"])
def test_compile_with_limit_lets_every_variant_compile(native, monkeypatch):
    from speedgpt.train import compile as compile_module

    if native and not compile_module.compile_takes_recompile_limit():
        pytest.skip("this torch.compile has no recompile_limit argument")
    monkeypatch.setattr(compile_module, "compile_takes_recompile_limit", lambda: native)
    torch._dynamo.reset()
    counters.clear()  # reset() keeps them
    try:
        variants = [_Variant(k) for k in range(3)]
        for m in variants:
            compile_module.compile_with_limit(m, 3, backend="eager", dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=1):
            for m in variants:
                m(torch.zeros(2))
        assert not counters["unimplemented"], dict(counters["unimplemented"])  # nothing ran eagerly
        assert counters["stats"]["unique_graphs"] == 3
        extra = _Variant(3)  # a fourth variant passes the limit of 3: dynamo runs it eagerly
        compile_module.compile_with_limit(extra, 3, backend="eager", dynamic=False)
        with torch._dynamo.config.patch(recompile_limit=1):
            extra(torch.zeros(2))
        assert counters["unimplemented"] and counters["stats"]["unique_graphs"] == 3
    finally:
        torch._dynamo.reset()


def test_flex_attention_stops_rather_than_running_eagerly():
    """The CUDA path of model/attention.py runs flex through this function under torch.compile: compiled it
    computes, but where dynamo gives up on it (here its recompile limit, 1, at a second shape) it stops with
    one line instead of building the dense score matrix (issue 33: 1536 GiB)."""
    from speedgpt.model.attention import flex_attention_compiled_only

    torch._dynamo.reset()
    try:
        f = torch.compile(flex_attention_compiled_only, backend="eager", dynamic=False)
        q, q2 = torch.randn(1, 2, 128, 16), torch.randn(1, 2, 256, 16)
        with torch._dynamo.config.patch(recompile_limit=1):
            assert f(q, q, q, None, 0.25).shape == q.shape
            with pytest.raises(RuntimeError, match="flex attention fell back to eager on cpu"):
                f(q2, q2, q2, None, 0.25)
        with pytest.raises(RuntimeError, match="dense 128 x 128 score matrix"):
            flex_attention_compiled_only(q, q, q, None, 0.25)
    finally:
        torch._dynamo.reset()


@pytest.fixture
def flex_as_on_a_gpu(monkeypatch):
    """model/attention.py's CUDA path of flex, on CPU: eager callers through the lazily compiled wrapper, and
    flex's refusal of a CPU backward lifted (a Python check before the op; the op's own backward is plain
    math on any device, which the eager backend runs). Yields the attention module."""
    import torch.nn.attention.flex_attention as flex_module

    from speedgpt.model import attention

    monkeypatch.setattr(attention, "FUSED_FLEX_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(attention, "_compiled_flex", None)
    monkeypatch.setattr(flex_module, "_validate_device", lambda *args: None)
    torch._dynamo.reset()
    try:
        yield attention
    finally:
        torch._dynamo.reset()


def test_flex_in_a_compiled_model_is_traced_once(flex_as_on_a_gpu, monkeypatch, one_thread):
    """Issue 33: every GPU start logged a second training graph, `_compiled_flex is None`: the compiled model
    reached flex's lazily compiled wrapper, so dynamo guarded on that global, and the first call set it.
    Inside a compiled region flex is now called directly; eager callers keep the wrapper (the fused kernel)."""
    attention = flex_as_on_a_gpu
    watch = CompileWatch()
    try:
        q = torch.randn(1, 2, 128, 16, requires_grad=True)

        def step(q):
            return attention.flex_attention_fused(q, q, q, None, 0.25).square().mean()

        compiled = torch.compile(step, backend="eager", dynamic=False)
        with watch.span("training"):
            for _ in range(2):
                compiled(q).backward()
        (training,) = watch.spans
        assert (training.graphs, training.recompiles) == (1, []), "\n".join(watch.lines())
        assert attention._compiled_flex is None  # the compiled step never made the wrapper
    finally:
        watch.close()
    wrapper_out = torch.zeros(1)
    monkeypatch.setattr(attention, "_compiled_flex", lambda *args, **kwargs: wrapper_out)
    assert attention.flex_attention_fused(q, q, q, None, 0.25) is wrapper_out  # an eager caller


def test_watch_counts_graphs_and_says_why_it_recompiled():
    torch._dynamo.reset()
    watch = CompileWatch()
    try:
        f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        with watch.span("first"):
            f(torch.ones(3))
        with watch.span("second"):
            f(torch.ones(3))  # the same shape: no new graph
            f(torch.ones(4))
        first, second = watch.spans
        assert (first.graphs, first.recompiles) == (1, [])
        assert second.graphs == 1 and len(second.recompiles) == 1
        assert "size mismatch at index 0. expected 3, actual 4" in second.recompiles[0]
        assert watch.record()["graphs"] == 2 and watch.lines()[0].startswith("compile: 2 graph(s)")
    finally:
        watch.close()
        torch._dynamo.reset()


def test_recompile_reason_is_the_function_and_its_newest_failed_guard():
    message = ("Recompiling function forward in /x/gpt.py:254\n    triggered by the following guard failure(s):\n"
               "    - 0/1: self.embed_tied == True                      # return F.embedding(  # gpt.py:222\n"
               "    - 0/0: tensor 'x' size mismatch at index 0. expected 2, actual 1")
    assert recompile_reason(message) == "forward: self.embed_tied == True"


def test_mtp_stages_share_one_weight_count_and_score_the_same_loss():
    """speedrun-latest's stages of 3 and 2 MTP weights enter the model as 3 each (one graph): stage 1's
    third weight is 0, which leaves the loss as its 2 weights give it."""
    from speedgpt.model.mtp import multi_token_loss
    from speedgpt.plan import RunPlan
    from speedgpt.train.step_schedule import StepInputs

    plan = RunPlan.of(load_preset("speedrun-latest"))
    inputs = StepInputs(plan, torch.device("cpu"))
    s0, s1, s2 = plan.stages
    assert [len(plan.mtp_weights_at(s.start)) for s in plan.stages] == [3, 2, 1]
    assert inputs.mtp_weights_at(s0.start).tolist() == [1.0, 0.5, 0.25]
    assert inputs.mtp_weights_at(s1.start).tolist() == [1.0, 0.5, 0.0]
    assert inputs.mtp_weights_at(s2.start).tolist() == [1.0, 0.0, 0.0]  # one row shape: stage 0's graph
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(2, 16, 32, generator=g), torch.randint(0, 32, (2, 16), generator=g)
    padded = multi_token_loss(logits, targets, inputs.mtp_weights_at(s1.start + 3))
    own = multi_token_loss(logits, targets, torch.tensor(plan.mtp_weights_at(s1.start + 3)))
    assert padded.item() == pytest.approx(own.item(), rel=1e-6)


def test_a_next_token_stage_in_an_mtp_stages_shape_scores_zero_weights_with_the_plain_loss(text_shards):
    """Stage 2 of speedrun-latest (rows of one shape) enters the model with weights (1, 0, 0), not None; the
    model's loss with them is its plain next-token loss (float rounding), and so is its gradient. In rows of another
    shape than the MTP stages' (the preset's earlier 2 x 16K, then 1 x 48K) it stays None: the plain loss, the
    cheaper op, since that stage recompiles anyway."""
    from speedgpt.model.build import model_from_config
    from speedgpt.plan import RunPlan
    from speedgpt.train.step_schedule import StepInputs

    cfg = scaled_preset("speedrun-latest", text_shards)
    plan = RunPlan.of(cfg)
    inputs = StepInputs(plan, torch.device("cpu"))
    s2 = plan.stages[2]
    assert plan.mtp_weights_at(s2.start) == (1.0,)
    assert inputs.mtp_weights_at(s2.start).tolist() == [1.0, 0.0, 0.0]
    two_shapes = apply_overrides(cfg, ["--data.seq_len=48"])
    for stage, rows in zip(two_shapes.train.stages, (16, 16, 48)):
        stage.seq_len = rows
    assert StepInputs(RunPlan.of(two_shapes), torch.device("cpu")).mtp_weights_at(s2.start) is None
    model = model_from_config(cfg, "cpu", step=s2.start)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # zero-initialized output projections and head would leave most gradients 0
        for p in model.parameters():
            if p.dim() == 2 and not p.any():
                p.normal_(std=0.05, generator=g)
    x = torch.randint(0, cfg.model.vocab_size, (1, 32), generator=g)
    y = torch.randint(0, cfg.model.vocab_size, (1, 32), generator=g)
    losses, grads = [], []
    for weights in (None, inputs.mtp_weights_at(s2.start)):
        model.zero_grad()
        loss = model(x, y, windows=plan.windows_at(s2.start), mtp_weights=weights)
        loss.backward()
        losses.append(loss.item())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert grads[1].keys() == grads[0].keys()
    for name, grad in grads[0].items():
        # float32 gradients to float32 rounding; the preset's bf16 embeddings' (model.bf16_embeds) to bf16 rounding,
        # torch's own tolerance for the dtype: a sum in another order can round one element to the next bf16 value
        # (embed.weight, on one CPU: 3.05e-05 at 0.0078, one bf16 step), which a float32 tolerance called a mismatch
        tol = {} if grad.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-7}
        torch.testing.assert_close(grads[1][name], grad, **tol, msg=lambda m, name=name: f"{name}: {m}")
