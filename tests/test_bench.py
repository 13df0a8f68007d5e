"""`speedgpt bench`'s accounting (not its timings): the FLOPs and tokens of the steps it times."""

from __future__ import annotations

import pytest

from speedgpt.bench import format_results, timed_steps, timed_work
from speedgpt.config import apply_overrides
from speedgpt.model.build import build_model
from speedgpt.stages import stage_plan
from test_stages import TABLE


def test_each_timed_step_counts_at_its_own_stages_row_length(tiny_cfg):
    """Stage 0 trains rows of 32 tokens, stages 1-2 rows of data.seq_len = 64: attention's FLOPs per
    token differ, and a step of stage 0 must not be counted at 64."""
    cfg = apply_overrides(tiny_cfg, [TABLE])
    plan = stage_plan(cfg)
    model = build_model(cfg.model, plan.max_seq_len(), "cpu", seed=0)
    per_token = model.flops_per_token
    assert per_token(32) < per_token(64)  # the difference this test is about

    steps = timed_steps(cfg.train.steps, 4)  # 0, 3 (stage 0), 6 (stage 1), 9 (stage 2)
    work = timed_work(plan, steps, per_token)
    assert work["tokens"] == 256 + 256 + 512 + 512
    assert work["flops"] == pytest.approx(2 * 256 * per_token(32) + 2 * 512 * per_token(64), rel=1e-12)
    assert work["flops"] < work["tokens"] * per_token(cfg.data.seq_len)  # what bench counted before
    assert work["stages"] == "stage 0 (seq_len 32) x2, stage 1 (seq_len 64) x1, stage 2 (seq_len 64) x1"

    only_first = timed_work(plan, timed_steps(cfg.train.steps, 3, at_step=2), per_token)
    assert only_first["flops"] == pytest.approx(3 * 256 * per_token(32), rel=1e-12)
    assert only_first["stages"] == "stage 0 (seq_len 32) x3"


def test_without_a_stage_table_every_step_is_the_runs_own(tiny_cfg):
    plan = stage_plan(tiny_cfg)
    work = timed_work(plan, [0, 5], lambda seq_len: 10.0 * seq_len)
    assert work["tokens"] == 2 * tiny_cfg.train.batch_tokens
    assert work["flops"] == 2 * tiny_cfg.train.batch_tokens * 10.0 * tiny_cfg.data.seq_len
    assert work["stages"] == f"one stage (seq_len {tiny_cfg.data.seq_len}) x2"


def test_the_printout_names_the_timed_stages():
    row = {"tok_per_s": 1.0, "world_size": 1, "timed_stages": "stage 1 (seq_len 64) x2"}
    text = format_results([("A", row), ("B", dict(row, tok_per_s=2.0))], None)
    assert "A timed steps: stage 1 (seq_len 64) x2" in text and "B timed steps:" in text


def test_the_printout_says_how_long_the_warmup_waited_for_the_validation_helper():
    note = "compile: validation's graph compiled ahead by a helper process (done 86.8s after it started; waited 0.0s)"
    row = {"tok_per_s": 1.0, "world_size": 1, "validation_ahead": note}
    text = format_results([("A", row), ("B", {"tok_per_s": 1.0, "world_size": 1})], None)
    assert f"A {note}" in text.splitlines() and "B compile:" not in text


def test_the_printout_names_the_slowest_kernel_compiles():
    """A GPU's cold start waits on Triton's kernel compiles (wave 17: 37.4 of 133.5 s): bench names the slowest, as
    the start log does; a CPU compiles no Triton kernel, and its printout has no such line."""
    from speedgpt.train.compile_watch import describe_kernels

    slowest = describe_kernels([["triton_tem_fused_flex_0 [forward 0/0]", 21.04], ["triton_red_fused_1 [0/0]", 3.2]])
    row = {"tok_per_s": 1.0, "world_size": 1, "compile_slowest_kernels": slowest}
    text = format_results([("A", row), ("B", {"tok_per_s": 1.0, "world_size": 1})], None)
    assert ("A slowest kernel compiles (each its own seconds, in parallel workers): triton_tem_fused_flex_0 "
            "[forward 0/0] 21.0s, triton_red_fused_1 [0/0] 3.2s") in text
    assert "B slowest kernel compiles" not in text


def test_run_mean_weights_each_stage_by_its_steps():
    """Total tokens over total time: a plain mean of the stages' tok/s (1250 here) would overstate a
    run whose long stage is the slow one."""
    from speedgpt.bench import run_mean

    rows = [{"run_steps": 100, "batch_tokens": 1000, "step_ms": 1000.0, "flops_per_token": 10.0},
            {"run_steps": 300, "batch_tokens": 3000, "step_ms": 2000.0, "flops_per_token": 20.0}]
    m = run_mean(rows)
    assert m["train_s"] == pytest.approx(700.0)
    assert m["tok_per_s"] == pytest.approx(1_000_000 / 700)
    assert m["step_s"] == pytest.approx(700 / 400)
    assert m["tokens_per_step"] == pytest.approx(1_000_000 / 400)
    assert m["flops_per_token"] == pytest.approx((100_000 * 10 + 900_000 * 20) / 1_000_000)


def test_timed_steps_stay_inside_a_stage_and_cycle_adams_phases():
    from speedgpt.optim.container import Optimizers

    assert timed_steps(20, 4, first=11) == [11, 13, 15, 17]
    opts = Optimizers(None, None, {}, None, adam_every=2)
    steps = timed_steps(20, 4, adam_every=2, first=11)
    assert all(11 <= s < 20 for s in steps) and sum(opts.adam_due(s) for s in steps) == 2


def test_dynamo_compiles_counts_a_recompile():
    import torch

    from speedgpt.bench import dynamo_compiles

    fn = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    fn(torch.ones(2))
    before = dynamo_compiles()
    fn(torch.ones(2))
    assert dynamo_compiles() == before  # guards match: no compile
    fn(torch.ones(3))
    assert dynamo_compiles() > before  # a new shape: recompiled


def test_per_stage_bench_times_every_stage_and_the_run_mean(tiny_cfg, one_thread, capsys, tmp_path, monkeypatch):
    """`bench --per-stage` on CPU with a 2-stage table: the structure of its figures, not their speed."""
    import tempfile

    from speedgpt.bench import bench_config

    cfg = apply_overrides(tiny_cfg, ["--train.stages=[{share=0.5, batch_tokens=256, seq_len=32}, {share=0.5}]",
                                     "--train.val_every=0", "--train.peak_flops=1e12"])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = bench_config(cfg, 1, per_stage=True)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("speedgpt-bench-")] == []  # the scratch run dir
    rows = out["per_stage"]
    assert [(r["stage"], r["first_step"], r["last_step"], r["run_steps"]) for r in rows] == [(0, 0, 5, 6), (1, 6, 11, 6)]
    assert [(r["batch_tokens"], r["rows"], r["seq_len"], r["ranks_micro_rows"]) for r in rows] == [
        (256, 8, 32, "1 x 1 x 8"), (512, 8, 64, "1 x 1 x 8")]
    assert all(r["timed_steps"] == 1 and r["recompiles"] == 0 and r["step_ms"] > 0 for r in rows)
    assert all(0 < r["mfu_datasheet"] for r in rows)
    assert out["run_train_s"] == pytest.approx(sum(6 * r["step_ms"] / 1e3 for r in rows))
    assert out["tok_per_s"] == pytest.approx((6 * 256 + 6 * 512) / out["run_train_s"])
    assert out["timed_stages"] == "stage 0 (seq_len 32) x1, stage 1 (seq_len 64) x1"
    assert "host_syncs_per_step" not in out  # CPU: nothing measured, so no figure (not a 0)
    text = format_results([("A", out)], None)
    assert "A per stage (1 timed steps in each" in text and "run mean (stages weighted by their steps)" in text
    assert "A memory estimate: ddp on 1 rank(s)" in text and "recompile(s) after the warmup" not in text
    assert out["compile_call_s"] >= 0 and "compile_call_s" in text  # a saved package's install, where one is found
    assert "recompile(s) after the warmup" in format_results([("A", dict(out, per_stage=[dict(rows[0], recompiles=2)]))], None)


def test_time_steps_reads_each_steps_communication_waits_after_the_step():
    """A step's waits are handed over before the next step starts (which clears them: GradSync's
    `timing` setter) and read once the window ends, so no step is timed with a sync inside it."""
    from types import SimpleNamespace

    import torch

    from speedgpt.bench import time_steps
    from speedgpt.parallel.ddp import GradSync

    sync = GradSync(world_size=2, rank=0, device=torch.device("cpu"))
    steps_run = []

    def train_step(s):
        sync.timing = True  # what the trainer does on a logging step: clears the last step's waits
        sync._timers.append(float(s))  # a gloo wait of s ms (host clock)
        steps_run.append(s)

    loader = SimpleNamespace(next_batch=lambda: None)
    trainer = SimpleNamespace(device=torch.device("cpu"), train_step=train_step, grad_sync=sync, loader=loader)
    step_times, comm_ms, loader_s = time_steps(trainer, [3, 5, 7])
    assert steps_run == [3, 5, 7] and len(step_times) == 3
    assert comm_ms == [3.0, 5.0, 7.0]  # each step's own wait; none lost to the next step's clearing
    assert sync.comm_wait_ms() is None  # handed over: nothing left behind


def _bench_two_ranks(rank, world_size, cfg, out):
    from speedgpt.bench import bench_config
    from speedgpt.parallel.dist import teardown

    row = bench_config(cfg, steps=2)
    teardown()
    if rank == 0:
        out.write_text(row["comm_wait_ms_by_rank"])


def test_a_multi_rank_bench_names_every_ranks_wait(tiny_cfg, tmp_path, monkeypatch):
    """The rank that waits least on the collectives is the one the others wait for: bench's table
    names every rank's wait, not rank 0's alone (two gloo ranks)."""
    from distkit import spawn_local

    cfg = apply_overrides(tiny_cfg, ["--train.steps=4", "--train.val_every=0", "--train.compile=false"])
    out = tmp_path / "waits.txt"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the ranks' temp dir (each a new process)
    spawn_local(_bench_two_ranks, 2, cfg, out)
    waits = out.read_text().split("/")
    assert len(waits) == 2 and all(float(w) >= 0 for w in waits)
    assert [p.name for p in scratch.iterdir() if p.name.startswith("speedgpt-bench-")] == []  # every rank's removed


@pytest.mark.parametrize("argv, says", [
    (["--ab=--model.depth=0"], "model.depth=0 must be at least 1"),
    (["--ab=--train.stepz=1"], "unknown config key 'train.stepz'"),
    (["--at-step", "-1"], "--at-step -1: must be a step of the run"),
    (["--at-step", "100000"], "--at-step 100000: must be a step of the run, 0 to 99"),
    (["--profile", "-2"], "--profile -2: must be >= 0"),
    (["--ab", ""], "--ab is empty"),  # only A was timed, exit 0
    # tiny-cpu's own depth: two timings of one config were printed as an A/B of the change, exit 0
    (["--ab=--model.depth=4"], "--ab '--model.depth=4' changes nothing: A already has those values"),
    # on a CPU each measured nothing, exit 0 (the tests run without CUDA; a GPU machine skips these two)
    *([(["--profile", "3"], "--profile measures CUDA kernels"), (["--peak"], "--peak measures CUDA kernels")]
      if not __import__("torch").cuda.is_available() else []),
])
def test_bench_refuses_a_bad_arm_b_or_option_before_timing_arm_a(argv, says, capsys, monkeypatch):
    """A bad --ab was found only after arm A's compile and timed steps (on a GPU, minutes); now before anything."""
    from speedgpt import bench
    from speedgpt.cli import main

    monkeypatch.setattr(bench, "bench_config", lambda *a, **k: pytest.fail("arm A ran before B's check"))
    try:
        rc = main(["bench", "--preset", "tiny-cpu", *argv])
    except SystemExit as e:
        rc = e.code
    assert rc == 2 and says in capsys.readouterr().err
