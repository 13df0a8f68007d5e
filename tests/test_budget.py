"""A budget, not a step count: derived horizon, batch and width-scaled hyperparameters (budget.py)."""

import math

import pytest

from speedgpt.budget import (ANCHOR_BATCH_TOKENS, describe, ladder_model, optimal_batch_tokens, resolve_budget,
                             scaling_params)
from speedgpt.config import ConfigError, ModelConfig, apply_overrides, load_preset, load_toml, save_toml
from speedgpt.plan import validate

# nanochat's published depth ladder (its 32768-token vocabulary, 12 tokens per scaling parameter).
PUBLISHED = {8: 2**18, 10: 2**19, 12: 2**19, 14: 2**19, 16: 2**19, 18: 2**20, 20: 2**20, 22: 2**20, 24: 2**20,
             26: 2**20, 32: 2**21, 36: 2**21, 40: 2**21, 44: 2**21, 50: 2**21}


def ladder_cfg(depth: int, vocab: int = 50257, extra=()):
    return apply_overrides(load_preset("speedrun-124m"), [
        f"--model.depth={depth}", "--model.model_dim=0", "--model.attn_free_layers=[]", "--model.attn_gate=false",
        f"--model.vocab_size={vocab}", "--data.seq_len=2048", "--train.tokens_per_param=12",
        "--train.batch_tokens=0", *extra])


def test_scaling_params_are_matrices_plus_head():
    m = ModelConfig(depth=12, model_dim=768, vocab_size=50257)
    # 12 layers x (qkv 3 + out 1 + mlp 8) x 768^2, plus the 50304 x 768 head; no embeddings, no scalars
    assert scaling_params(m) == 12 * 12 * 768**2 + 50304 * 768


@pytest.mark.parametrize("depth", sorted(PUBLISHED))
def test_derived_batch_reproduces_the_published_table(depth):
    cfg, _ = resolve_budget(ladder_cfg(depth, vocab=32768))
    assert cfg.train.batch_tokens == PUBLISHED[depth]
    n = scaling_params(cfg.model)
    assert cfg.train.steps == round(12 * n / cfg.train.batch_tokens)
    validate(cfg)


def test_gpt2_vocabulary_moves_two_rungs():
    """Re-anchored on this architecture's own d12 with GPT-2's 50304-row head, the head is a larger
    share of small models' parameters: d8 lands on 2^19 (log2 18.51) and d32 on 2^20 (log2 20.45)."""
    got = {d: resolve_budget(ladder_cfg(d))[0].train.batch_tokens for d in (6, 8, 12, 20, 26, 32, 36)}
    assert got == {6: 2**18, 8: 2**19, 12: 2**19, 20: 2**20, 26: 2**20, 32: 2**20, 36: 2**21}


def test_anchor_is_d12_at_its_compute_optimal_horizon():
    m = ladder_model(ModelConfig(), 12)
    assert optimal_batch_tokens(12 * scaling_params(m), m) == ANCHOR_BATCH_TOKENS
    # doubling the horizon grows the optimal batch by 2^0.383 (rounding: still 2^19); x8 -> 2^1.15 -> 2^20
    assert optimal_batch_tokens(24 * scaling_params(m), m) == 2**19
    assert optimal_batch_tokens(96 * scaling_params(m), m) == 2**20


def test_flops_budget_derives_steps():
    base = ladder_cfg(12)
    per_token = describe(resolve_budget(base)[0]).flops / describe(resolve_budget(base)[0]).tokens
    cfg, lines = resolve_budget(apply_overrides(base, ["--train.tokens_per_param=0", "--train.flops_budget=1e18",
                                                       "--train.batch_tokens=262144"]))
    assert cfg.train.batch_tokens == 262144
    assert cfg.train.steps == round(1e18 / per_token / 262144)
    assert any("FLOPs" in line for line in lines)


def test_resolution_is_saved_and_idempotent(tmp_path):
    cfg, lines = resolve_budget(ladder_cfg(20, extra=["--optim.tuned_width=768", "--optim.muon_weight_decay=0.2",
                                                      "--optim.wd_schedule=linear"]))
    assert cfg.train.batch_tokens == 2**20 and cfg.optim.tuned_width == 0
    assert cfg.optim.muon_weight_decay == pytest.approx(0.2 * (768 / 1280) ** 2)
    assert cfg.optim.embed_lr == pytest.approx(load_preset("speedrun-124m").optim.embed_lr * (768 / 1280) ** 0.5)
    assert len(lines) == 3
    save_toml(cfg, tmp_path / "config.toml")
    again, more = resolve_budget(load_toml(tmp_path / "config.toml"))
    assert again.to_dict() == cfg.to_dict()
    assert not any("width" in line for line in more)


def test_defaults_resolve_to_themselves():
    for name in ("tiny-cpu", "speedrun-124m"):
        cfg = load_preset(name)
        assert resolve_budget(cfg) == (cfg, [])


@pytest.mark.parametrize("overrides, message", [
    (["--train.batch_tokens=0"], "train.batch_tokens=0 derives the batch"),
    (["--train.tokens_per_param=10", "--train.flops_budget=1e15"], "both set the horizon"),
    (["--train.tokens_per_param=-1"], "train.tokens_per_param=-1.0 must be finite and >= 0"),
    # (audit 29) int(nan) and int(inf) in the budget's arithmetic: a traceback's last line, exit 1
    (["--train.tokens_per_param=nan"], "train.tokens_per_param=nan must be finite and >= 0"),
    (["--train.flops_budget=inf"], "train.flops_budget=inf must be finite and >= 0"),
    (["--optim.tuned_width=768", "--optim.scale_lr_by_width=true"], "both scale the Adam lrs"),
    (["--train.tokens_per_param=12", "--train.batch_tokens=0", "--data.seq_len=96"],
     "derived batch of 131,072 tokens is not a whole number of rows of data.seq_len=96"),
])
def test_budget_errors_name_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_budget(apply_overrides(load_preset("tiny-cpu"), overrides))


def test_linear_weight_decay_reaches_zero():
    from speedgpt.optim.schedules import muon_weight_decay

    assert muon_weight_decay(0.2, "linear", 0.5, 0.0) == 0.2
    assert muon_weight_decay(0.2, "linear", 0.5, 0.75) == pytest.approx(0.05)
    assert muon_weight_decay(0.2, "linear", 1.0, 1.0) == 0.0


def test_trainer_prints_and_saves_the_resolved_budget(tmp_path, capsys, tiny_cfg):
    from speedgpt.train.loop import Trainer

    cfg = apply_overrides(tiny_cfg, ["--train.tokens_per_param=0.05"])
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    n = scaling_params(cfg.model)
    assert trainer.cfg.train.steps == round(0.05 * n / 512) != cfg.train.steps
    trainer.setup()
    saved = load_toml(tmp_path / "run" / "config.toml")
    assert saved.train.steps == trainer.cfg.train.steps and saved.train.tokens_per_param == 0.05
    assert "budget:" in capsys.readouterr().out
    assert math.isfinite(n)


@pytest.mark.parametrize("name, width, batch, steps", [("d12", 768, 2**19, 2828), ("d20", 1280, 2**20, 5237),
                                                       ("d26", 1664, 2**20, 10844)])
def test_ladder_presets_resolve_to_their_comments(name, width, batch, steps):
    from importlib import resources

    cfg, _ = resolve_budget(load_preset(name))
    validate(cfg, 8)
    n = scaling_params(cfg.model)
    assert (cfg.model.resolved_dim(), cfg.train.batch_tokens, cfg.train.steps) == (width, batch, steps)
    text = (resources.files("speedgpt") / "presets" / f"{name}.toml").read_text()
    assert f"resolved: {n:,} scaling params, batch {batch:,} tokens, {steps:,} steps" in text
    assert cfg.optim.muon_weight_decay == pytest.approx(0.036 * (768 / width) ** 2)


@pytest.mark.parametrize("name", ["d12", "d20", "d26"])
def test_ladder_memory_and_expected_time_in_comments_and_docs_are_the_estimates(name):
    """Issue 20's "memory and expected time per GPU kind in the docs": the estimator's ddp bf16 memory on 1
    and 8 GPUs and the FLOPs at 50 % MFU of the 989 TFLOP/s peak the H100 and H200 share, in the preset's
    comments and docs/scaling.md's ladder table."""
    from importlib import resources
    from pathlib import Path

    from speedgpt.parallel.memory import GIB, estimate_memory, param_counts
    from speedgpt.train.hardware import BF16_PEAK_FLOPS

    peaks = dict(BF16_PEAK_FLOPS)
    assert peaks["H100"] == peaks["H200"] == 989e12
    cfg, _ = resolve_budget(load_preset(name))
    counts = param_counts(cfg)
    m1, m8 = (estimate_memory(cfg, "ddp", w, counts=counts).total / GIB for w in (1, 8))
    h1 = describe(cfg).flops / (0.5 * 989e12) / 3600
    comment = " ".join((resources.files("speedgpt") / "presets" / f"{name}.toml").read_text().replace("# ", "").split())
    assert f"ddp, bf16): {m1:.1f} GiB on 1 GPU, {m8:.1f} on 8" in comment
    assert f"{h1:.2f} h on 1 GPU, {h1 / 8:.2f} h on 8 GPUs" in comment
    docs = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    row = next(line for line in docs.splitlines() if line.startswith(f"| {name} |"))
    assert row.endswith(f"| {m1:.1f} / {m8:.1f} GiB | {h1:.2f} h / {h1 / 8:.2f} h |"), row


@pytest.mark.parametrize("batch", ["262144", "0"])  # given, and derived from the horizon
def test_a_budget_below_one_step_is_refused_with_the_smallest_one(batch):
    from speedgpt.budget import BudgetBelowOneStep, smallest_horizon

    base = apply_overrides(ladder_cfg(4), ["--train.tokens_per_param=0", f"--train.batch_tokens={batch}"])
    with pytest.raises(BudgetBelowOneStep, match=r"train.flops_budget=1000 is .* less than one step") as e:
        resolve_budget(apply_overrides(base, ["--train.flops_budget=1e3"]))
    assert f"smallest train.flops_budget for this depth is {e.value.smallest:.3g} (one step)" in str(e.value)
    least = smallest_horizon(base)
    assert least == 262144 if batch != "0" else least < 262144
    cfg, _ = resolve_budget(apply_overrides(base, [f"--train.flops_budget={e.value.smallest:.3g}"]))  # as printed
    assert cfg.train.steps == 1 and cfg.train.batch_tokens == least
    per_token = describe(cfg).flops / describe(cfg).tokens
    with pytest.raises(BudgetBelowOneStep):  # just short of one step
        resolve_budget(apply_overrides(base, [f"--train.flops_budget={0.99 * least * per_token}"]))
    with pytest.raises(BudgetBelowOneStep, match=r"train.tokens_per_param=1e-09 .* smallest train.tokens_per_param"):
        resolve_budget(apply_overrides(base, ["--train.flops_budget=0", "--train.tokens_per_param=1e-9"]))


def test_rounding_to_whole_steps_is_said_when_it_moves_the_budget():
    base = apply_overrides(ladder_cfg(4), ["--train.tokens_per_param=0", "--train.batch_tokens=262144"])
    one_step = describe(resolve_budget(apply_overrides(base, ["--train.flops_budget=1e30"]))[0])
    per_step = one_step.flops / one_step.steps
    _, lines = resolve_budget(apply_overrides(base, [f"--train.flops_budget={1.4 * per_step}"]))
    assert any(line.startswith("warning: whole steps change the budget by -29%") for line in lines), lines
    _, lines = resolve_budget(apply_overrides(base, [f"--train.flops_budget={40.4 * per_step}"]))
    assert not any(line.startswith("warning") for line in lines)  # 1% off


def test_steps_given_on_the_command_line_beat_the_presets_budget(tmp_path):
    """`--preset d12 --train.steps=3` is a 3-step smoke test of d12's own batch, not its 2,828-step budget."""
    own = resolve_budget(load_preset("d12"))[0].train
    cfg, lines = resolve_budget(apply_overrides(load_preset("d12"), ["--train.steps=3"]))
    assert (cfg.train.steps, own.steps) == (3, 2828)
    assert (cfg.train.batch_tokens, cfg.train.horizon) == (own.batch_tokens, "steps")
    said = next(line for line in lines if "sets the horizon" in line)
    assert said.startswith("budget: train.steps=3 sets the horizon") and "tokens_per_param=12 derives the batch" in said
    save_toml(cfg, tmp_path / "config.toml")  # the saved config reproduces the run: 3 steps, not the budget's
    assert resolve_budget(load_toml(tmp_path / "config.toml"))[0].to_dict() == cfg.to_dict()
    # a budget key of 0 beside the steps (sweep's other budget) names no budget
    assert resolve_budget(apply_overrides(load_preset("d12"), ["--train.steps=3", "--train.flops_budget=0"]))[
        0].train.steps == 3


def test_steps_and_a_budget_in_one_command_are_refused_in_one_line(capsys):
    from speedgpt.cli import main

    with pytest.raises(ConfigError, match=r"^--train.steps=3 and --train.tokens_per_param=20 both set the horizon; "
                                          r"give one of them, or add --train.horizon=steps"):
        apply_overrides(load_preset("d12"), ["--train.steps=3", "--train.tokens_per_param=20"])
    assert main(["train", "--preset", "tiny-cpu", "--train.flops_budget=1e12", "--train.steps=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speedgpt train: config error: --train.steps=5 and --train.flops_budget=1e+12 both set")
    assert "\n" not in err
    # --train.horizon=steps says what to do with both: the budget derives the batch, the steps are the horizon
    cfg, _ = resolve_budget(apply_overrides(load_preset("d12"), ["--train.steps=3", "--train.tokens_per_param=48",
                                                                 "--train.horizon=steps"]))
    assert (cfg.train.steps, cfg.train.batch_tokens) == (3, 2**20)


def test_a_budget_on_the_command_line_beats_the_presets_steps():
    base = load_preset("speedrun-124m")
    cfg, lines = resolve_budget(apply_overrides(base, ["--train.tokens_per_param=12"]))
    assert cfg.train.steps == round(12 * scaling_params(cfg.model) / base.train.batch_tokens) != base.train.steps
    assert any(line.startswith("budget: train.tokens_per_param=12 sets the horizon") for line in lines)
    # and over a config whose steps an earlier command set (train.horizon=steps, e.g. an extended run's)
    steps_run = apply_overrides(load_preset("d12"), ["--train.steps=3"])
    again = apply_overrides(steps_run, ["--train.tokens_per_param=24"])
    assert again.train.horizon == "auto" and resolve_budget(again)[0].train.steps > 3
