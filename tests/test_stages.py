"""Training stages (speedgpt/stages.py, train.stages): the table as config data, its resolution, the
loop's per-stage shapes, warmup over every stage, no recompile mid-run, and exact resume across a
stage boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import counting_overrides
from distkit import drop_checkpoints_after
from speedgpt.config import ConfigError, apply_overrides, load_preset, load_toml, save_toml
from speedgpt.optim.schedules import lr_multiplier
from speedgpt.plan import RunPlan, validate
from speedgpt.stages import resolve_stage_table, stage_micro_batch, stage_plan
from speedgpt.train.loop import Trainer, train
from speedgpt.train.warmup import warmup_steps

# 12 steps: stage 0 = steps 0-5 (half batch, half rows, documents cut to 16 tokens, MTP over 3 tokens
# ramping down, a fixed window),
# stage 1 = 6-8 (two tokens ahead), stage 2 = 9-11 (plain, half the lr).
TABLE = ("--train.stages=["
         "{share=0.5, batch_tokens=256, seq_len=32, max_doc_len=16, window_long=32, mtp_weights=[1.0, 0.5, 0.25], "
         "mtp_weights_end=[1.0, 0.5, 0.0]},"
         "{share=0.25, mtp_weights=[1.0, 0.5]},"
         "{share=0.25, lr_mul=0.5}]")


@pytest.fixture
def staged_cfg(small_vocab_cfg):
    return apply_overrides(small_vocab_cfg, [TABLE])


def test_table_resolves_to_step_ranges_and_values(staged_cfg):
    plan = stage_plan(staged_cfg)
    assert [(s.start, s.end) for s in plan.stages] == [(0, 6), (6, 9), (9, 12)]
    s0, s1, s2 = plan.stages
    assert (s0.batch_tokens, s0.seq_len, s0.max_doc_len, s0.windows) == (256, 32, 16, (32, 16))
    assert (s1.batch_tokens, s1.seq_len, s1.windows) == (512, 64, None)  # zeros: the run's own keys
    assert s0.mtp_weights_at(0) == (1.0, 0.5, 0.25) and s0.mtp_weights_at(3) == (1.0, 0.5, 0.125)
    assert s1.mtp_weights_at(7) == (1.0, 0.5) and s2.predicts == 1 and s2.lr_mul == 0.5
    assert s2.row is staged_cfg.train.stages[2]  # hooks read keys of the row as given
    assert plan.stage_at(5) is s0 and plan.stage_at(6) is s1 and plan.stage_at(12) is s2
    run = RunPlan.of(staged_cfg)
    assert run.windows_at(0) == (32, 16) and run.windows_at(7) == (64, 32)  # the schedule's
    assert plan.has_mtp and plan.max_seq_len() == 64 and plan.min_batch_tokens() == 256


def test_no_table_is_one_stage_of_the_run_itself(tiny_cfg):
    plan = stage_plan(tiny_cfg)
    (s,) = plan.stages
    assert not plan.from_table and not plan.has_mtp
    assert (s.start, s.end, s.batch_tokens, s.seq_len, s.windows, s.lr_mul) == (0, 12, 512, 64, None, 1.0)
    assert stage_micro_batch(tiny_cfg, s) == (8, 1)


def test_table_round_trips_through_the_run_config(staged_cfg, tmp_path):
    save_toml(staged_cfg, tmp_path / "config.toml")
    text = (tmp_path / "config.toml").read_text()
    assert text.count("[[train.stages]]") == 3
    assert load_toml(tmp_path / "config.toml") == staged_cfg


def test_run_config_keeps_the_resolved_table(staged_cfg):
    resolved = resolve_stage_table(staged_cfg)
    s0, s1, s2 = resolved.train.stages
    assert (s0.window_long, s0.window_short, s0.mtp_weights_end) == (32, 16, [1.0, 0.5, 0.0])
    assert (s1.batch_tokens, s1.seq_len, s1.window_long, s1.mtp_weights_end) == (512, 64, 0, [1.0, 0.5])
    assert (s2.mtp_weights, s2.mtp_weights_end, s2.lr_mul) == ([1.0], [1.0], 0.5)
    assert stage_plan(resolved) == stage_plan(staged_cfg)  # the same run
    assert staged_cfg.train.stages[1].batch_tokens == 0  # a copy: the given config is left as it was


@pytest.mark.parametrize("table, fix", [
    ("[{share=0.5}, {share=0.4}]", "add up to 1"),
    ("[{share=0.99}, {share=0.01}]", "gets no step"),
    ("[{share=1.0, batch_tokens=500}]", "whole number of rows"),
    ("[{share=1.0, window_long=40}]", "multiple of schedule.window_block"),
    ("[{share=1.0, mtp_weights=[0.5, 0.5]}]", "must be 1.0"),
    ("[{share=1.0, mtp_weights=[1.0, 0.5], mtp_weights_end=[1.0]}]", "as many weights"),
    ("[{share=1.0, lr_mul=0.0}]", "lr_mul"),
    ("[{share=1.0, lr_mul=1e300}]", "times optim.bigram_embed_lr=0.6"),  # each fits float32, the product not
    ("[{share=1.0, max_doc_len=-1}]", "must be >= 0"),
    ("[{share=1.0, batch=3}]", "unknown config key 'train.stages[0].batch'"),
])
def test_bad_tables_name_the_fix(tiny_cfg, table, fix):
    with pytest.raises(ConfigError, match=fix.replace("[", r"\[").replace(".", r"\.")):
        validate(apply_overrides(tiny_cfg, [f"--train.stages={table}"]))


def test_micro_batch_stays_within_the_runs_own_micro_step(tiny_cfg):
    cfg = apply_overrides(tiny_cfg, ["--train.micro_batch_size=2",  # 2 rows of 64: 128 tokens per micro-step
                                     "--train.stages=[{share=0.5, seq_len=32}, {share=0.5, batch_tokens=384, seq_len=32}]"])
    a, b = stage_plan(cfg).stages
    assert stage_micro_batch(cfg, a) == (4, 4)  # 16 rows of 32 per step, 4 rows (128 tokens) per micro-step
    assert stage_micro_batch(cfg, b) == (4, 3)  # 12 rows: the largest divisor within the cap
    assert stage_micro_batch(cfg, b, world_size=2) == (3, 2)


class Recorder(Trainer):
    """Records the shape of every training batch and the stage hooks' calls."""

    def setup(self):
        super().setup()
        self.shapes: list[tuple[int, int, tuple[int, int]]] = []  # (step, micro-steps, (rows, seq_len))
        self.hook_calls: list[tuple[int | None, int]] = []
        self.stage_hooks.append(lambda tr, prev, stage: tr.hook_calls.append(
            (prev.index if prev is not None else None, stage.index)))
        next_batch = self.loader.next_batch

        def spy(rows, seq_len, max_doc_len):
            inputs, targets = next_batch(rows, seq_len, max_doc_len)
            self.shapes.append(tuple(inputs.shape))
            return inputs, targets

        self.loader.next_batch = spy


@pytest.fixture(scope="module")
def full_run(counting_shards, tmp_path_factory):
    """One uninterrupted staged run with a checkpoint every 2 steps, shared by the tests below."""
    cfg = apply_overrides(load_preset("tiny-cpu"), counting_overrides(counting_shards) + [
        TABLE, "--train.checkpoint_every=2", "--train.keep_checkpoints=0"])
    run_dir = tmp_path_factory.mktemp("staged") / "run"
    tr = Recorder(cfg, run_dir=run_dir, quiet=True)
    return cfg, tr, tr.run()


def test_loop_changes_shapes_at_stage_boundaries(full_run):
    cfg, tr, result = full_run
    assert result.steps == 12 and result.tokens == 6 * 256 + 6 * 512
    assert tr.shapes == [(8, 32)] * 6 + [(8, 64)] * 6  # all rows at once (micro_batch_size 0)
    assert tr.hook_calls == [(None, 0), (0, 1), (1, 2)]
    group = tr.optimizers.muon.param_groups[0]  # as the last step (11, stage 2) left it: lr_mul 0.5 on the schedule
    assert group["lr"] == group["initial_lr"] * lr_multiplier(cfg.schedule, 11, 12) * 0.5
    assert all(torch.isfinite(torch.tensor(result.train_losses)))


def test_warmup_visits_every_stage_and_resets_exactly(full_run, tmp_path):
    cfg, _, cold = full_run
    tr = Recorder(apply_overrides(cfg, ["--train.warmup_steps=2"]), run_dir=tmp_path / "warm", quiet=True)
    warm = tr.run()
    assert warmup_steps(tr.cfg, tr.plan) == [0, 6, 9]
    assert tr.shapes[:3] == [(8, 32), (8, 64), (8, 64)]  # each stage's first step, before the run
    assert tr.hook_calls[:4] == [(None, 0), (0, 1), (1, 2), (None, 0)]  # re-entered stage 0 after the reset
    assert warm.train_losses == cold.train_losses  # the warmup leaves no trace in the numbers


def test_resume_across_a_stage_boundary_is_bit_equal(full_run):
    cfg, first, full = full_run
    # Exactly at stage 1's first step, then inside stage 0: each resumed run crosses the later boundaries.
    for resume_at in (6, 4):
        drop_checkpoints_after(first.run_dir, resume_at)
        tr = Recorder(cfg, run_dir=first.run_dir, resume=True, quiet=True)
        resumed = tr.run()
        assert resumed.steps == 12 and resumed.tokens == full.tokens
        assert resumed.train_losses == full.train_losses[resume_at:]  # bitwise on CPU
        assert resumed.val_loss == full.val_loss
        assert tr.hook_calls[0] == (None, 0 if resume_at < 6 else 1)


def test_no_stage_recompiles_after_the_warmup(staged_cfg, tmp_path):
    """Compiled (dynamo with the eager backend, so the test needs no C++ compiler): the warmup compiles
    every stage's graphs; the timed run adds none, though MTP weights and windows change values."""
    from torch._dynamo.utils import counters

    cfg = apply_overrides(staged_cfg, ["--train.compile=true", "--train.compile_backend=eager",
                                       "--train.warmup_steps=1"])

    class Probe(Trainer):
        def warmup_then_reset(self):
            out = super().warmup_then_reset()
            self.graphs_after_warmup = counters["stats"]["unique_graphs"]
            return out

    torch._dynamo.reset()
    counters.clear()
    try:
        tr = Probe(cfg, run_dir=tmp_path / "run", quiet=True)
        tr.run()
        assert tr.graphs_after_warmup >= 3  # stage 0, stage 1 (MTP over 2), stage 2 (plain)
        assert counters["stats"]["unique_graphs"] == tr.graphs_after_warmup
    finally:
        torch._dynamo.reset()


def test_a_stage_whose_pieces_are_shorter_than_its_window_is_warned_about():
    from speedgpt.planner import plan_run
    from speedgpt.train.build import data_epoch_lines

    cfg = apply_overrides(load_preset("speedrun-latest"), ["--train.steps=300", "--train.device=cpu"])
    assert not [line for line in data_epoch_lines(cfg, plan_run(cfg, 4), 10**9) if "attention window" in line]
    short = apply_overrides(cfg, ["--train.stages=[{share=0.5, batch_tokens=131072, seq_len=16384, max_doc_len=896},"
                                  " {share=0.5, max_doc_len=1024}]"])
    warned = [line for line in data_epoch_lines(short, plan_run(short, 4), 10**9) if "attention window" in line]
    assert warned == ["warning: stage 1 cuts documents into pieces of <= 1024 tokens, shorter than its long attention "
                      "window of 1792: validation on long documents may rise as windows grow; raise "
                      "train.stages[1].max_doc_len to >= 1792 (0: no cap)"]


def test_a_cap_that_takes_most_whole_windows_away_is_warned_about_from_the_documents_lengths():
    """Wave 5: pieces <= 2,048 with a 1,792 window (15 % of tokens with a whole window, 82 % uncut) made
    validation rise late; <= 8,192 (69 %) did not. The start warns from the documents' lengths."""
    import numpy as np

    from speedgpt.data.coverage import Coverage
    from speedgpt.planner import plan_run
    from speedgpt.train.build import data_epoch_lines

    long_files = Coverage(500_000, np.full(10, 50_000))  # 24 whole pieces of 2,048 and 848 tokens a file
    assert long_files.full_window_share(2048, 1792) == 24 * (2048 - 1792) / 50_000
    assert long_files.full_window_share(0, 1792) == (50_000 - 1792) / 50_000
    assert long_files.full_window_share(2048, 1792, crop=True) == (2048 - 1792) / 2048

    def warned(cap, documents, long_docs="mix"):
        cfg = apply_overrides(load_preset("speedrun-124m"), ["--train.steps=300", "--train.device=cpu",
                                                             f"--data.max_doc_len={cap}", f"--data.long_docs={long_docs}"])
        return [line for line in data_epoch_lines(cfg, plan_run(cfg, 4), 10**9, documents=documents)
                if "window" in line]

    assert warned(2048, long_files) == [
        "warning: the run cuts documents into pieces of <= 2048 tokens: 12% of its training tokens have a whole "
        "1792-token window of their own document behind them, 96% uncut; validation on long documents may rise as "
        "windows grow (docs/data.md); raise data.max_doc_len to >= 8192 (75% of the uncut share) or 0 (no cap)"]
    assert warned(8192, long_files) == []
    # crop keeps each file's first piece only: 12.5 % of the kept tokens at 2,048, 78 % at 8,192
    assert "12% of its training tokens" in warned(2048, long_files, "crop")[0]
    assert warned(8192, long_files, "crop") == []
    short_files = Coverage(1000 * 1000, np.full(1000, 1000))  # no document holds a whole window: nothing to lose
    assert warned(896, short_files) == []
    # a stage table: only the last stage, the one the final model is fitted on, is held to it (record #72 caps
    # its early stages on purpose)
    table = apply_overrides(load_preset("speedrun-latest"), [
        "--train.steps=300", "--train.device=cpu", "--train.stages=[{share=0.5, batch_tokens=131072, seq_len=16384, "
        "max_doc_len=896}, {share=0.5, max_doc_len=MAX}]".replace("MAX", "8192")])
    assert not [line for line in data_epoch_lines(table, plan_run(table, 4), 10**9, documents=long_files)
                if "window" in line]
    table = apply_overrides(table, ["--train.stages=[{share=0.5, batch_tokens=131072, seq_len=16384, "
                                    "max_doc_len=896}, {share=0.5, max_doc_len=2048}]"])
    assert [line[:40] for line in data_epoch_lines(table, plan_run(table, 4), 10**9, documents=long_files)
            if "window" in line] == ["warning: stage 1 cuts documents into pie"]


def test_rows_fit_a_world_size_their_stage_does_not_split_into():
    """stages.fit_rows_to_world: speedrun-latest's rows of 32,768 are one shape on 1, 2 and 4 ranks; on 8 its first
    stage's 16,384 tokens a rank become one row of that length and its last stage's 49,152 one row too (less than two
    rows of 32,768), each said in a line; a share of more than two rows takes their gcd; a batch that does not split
    among the ranks stays an error, and a config without a stage table keeps its rows."""
    from speedgpt.planner import plan_run

    latest = load_preset("speedrun-latest")
    for world in (1, 2, 4):
        plan = plan_run(latest, world)
        assert {s.seq_len for s in plan.stages} == {32768} and not plan.budget_lines
    plan = plan_run(latest, 8)
    assert [(s.seq_len, plan.stage_batch(s)) for s in plan.stages] == [(16384, (1, 1)), (32768, (1, 1)),
                                                                       (49152, (1, 1))]
    assert plan.cfg.data.seq_len == 49152 and [r.seq_len for r in plan.cfg.train.stages] == [16384, 32768, 49152]
    assert [line.split(":")[0] for line in plan.budget_lines] == ["train.stages[0]", "train.stages[2]", "data.seq_len"]
    assert "rows of 16,384 tokens on 8 ranks" in plan.budget_lines[0]
    wide = apply_overrides(latest, ["--train.stages=[{share=0.5,batch_tokens=81920,seq_len=16384},{share=0.5}]"])
    assert plan_run(wide, 1).stages[0].seq_len == 16384  # 5 rows on one rank
    assert plan_run(wide, 2).stages[0].seq_len == 8192  # 40,960 a rank: more than two rows of 16,384, so the gcd
    with pytest.raises(ConfigError, match="a multiple of 3 rank"):
        plan_run(latest, 3)
    single = apply_overrides(load_preset("tiny-cpu"), ["--train.batch_tokens=1024", "--data.seq_len=256"])
    with pytest.raises(ConfigError, match="does not divide across 8 ranks"):
        plan_run(single, 8)
    # a table whose batch is not whole rows on any world size is the user's mistake: named, not fitted
    for batch, rows in ((6000, 1024), (2560, 1024)):
        broken = apply_overrides(load_preset("tiny-cpu"), [
            f"--train.stages=[{{share=0.5,batch_tokens={batch},seq_len={rows}}},{{share=0.5}}]"])
        with pytest.raises(ConfigError, match=f"whole number of rows of seq_len={rows}"):
            plan_run(broken, 2)


def test_a_resume_on_another_world_size_may_plan_other_rows_on_the_same_schedule():
    """train/resume.py's schedule check leaves a stage's row length out: speedrun-latest planned on 4 ranks (rows of
    32,768) and on 8 (fitted rows) has the same schedule; a changed share still counts."""
    from speedgpt.planner import plan_run
    from speedgpt.train.resume import schedule_changes

    on_four = plan_run(load_preset("speedrun-latest"), 4).cfg.to_dict()
    on_eight = plan_run(load_preset("speedrun-latest"), 8).cfg
    assert on_four["train"]["stages"][0]["seq_len"] != on_eight.train.stages[0].seq_len
    assert schedule_changes(on_four, on_eight) == []
    moved = apply_overrides(on_eight, [])
    moved.train.stages[0].share, moved.train.stages[1].share = 0.30, 0.36
    assert [c.split(":")[0] for c in schedule_changes(on_four, moved)] == ["train.stages"]


def test_two_ranks_train_in_fitted_rows_as_one_rank_does_in_those_rows(small_vocab_cfg, tmp_path, monkeypatch):
    """On 2 gloo ranks stage 0's 64 tokens are 32 a rank, half a row of 64: the planner fits its rows to 32 and
    the run trains; its losses equal one rank's with rows of 32 written in the table (the same batches), and its
    config.toml keeps the fitted rows (a resume plans the same)."""
    from test_parallel_train import run_two

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    table = "--train.stages=[{{share=0.5, batch_tokens=64{}}}, {{share=0.5}}]"
    run = ["--train.steps=4", "--train.val_every=0", "--train.checkpoint_every=0", "--train.micro_batch_size=1",
           "--train.save_final_checkpoint=false"]
    two, _ = run_two(apply_overrides(small_vocab_cfg, run + [table.format("")]), tmp_path / "two", tmp_path)
    one = train(apply_overrides(small_vocab_cfg, run + [table.format(", seq_len=32")]), run_dir=tmp_path / "one",
                quiet=True).train_losses
    np.testing.assert_allclose(two, one, rtol=2e-4, atol=0)
    saved = load_toml(tmp_path / "two" / "config.toml")
    assert [row.seq_len for row in saved.train.stages] == [32, 64]



def test_under_cuda_graphs_the_warmup_calls_each_stages_graph_twice():
    """torch's CUDA graphs record a graph on its second call: with one warmup step a stage, a rank with one
    micro-step a step would record inside the timed run. Under reduce-overhead each stage's second step is warmed
    up too."""
    from speedgpt.config import apply_overrides, load_preset
    from speedgpt.stages import stage_plan
    from speedgpt.train.warmup import warmup_steps

    cfg = load_preset("speedrun-latest")
    plan = stage_plan(cfg)
    assert warmup_steps(cfg, plan) == [0, 559, 1119]
    ro = apply_overrides(cfg, ["--train.compile_mode=reduce-overhead"])
    assert warmup_steps(ro, stage_plan(ro)) == [0, 1, 559, 560, 1119, 1120]
    plain = apply_overrides(load_preset("speedrun-124m"), ["--train.compile_mode=reduce-overhead"])
    assert warmup_steps(plain, stage_plan(plain)) == [0, 1]
