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
