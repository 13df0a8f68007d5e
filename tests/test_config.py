import re

import pytest

from speedgpt.config import (ConfigError, apply_overrides, load_preset, load_toml, micro_batch_rows, preset_names,
                             save_toml)
from speedgpt.plan import validate


def test_presets_load_and_validate():
    names = preset_names()
    assert {"tiny-cpu", "speedrun-124m"} <= set(names)
    for name in names:
        cfg = load_preset(name)
        validate(cfg)
        assert cfg.preset == name


def test_overrides_parse_types():
    cfg = apply_overrides(load_preset("tiny-cpu"), [
        "--model.depth=6", "--optim.muon_lr=0.03", "--model.unet_skips=false", "--model.attn_free_layers=[1, 2]",
        "--run.name=hello", "--train.batch_tokens=8192", "optim.embed_lr=1"])
    assert cfg.model.depth == 6 and cfg.optim.muon_lr == 0.03 and cfg.model.unet_skips is False
    assert cfg.model.attn_free_layers == [1, 2] and cfg.run.name == "hello"
    assert cfg.optim.embed_lr == 1.0 and isinstance(cfg.optim.embed_lr, float)
    # the preset itself is untouched
    assert load_preset("tiny-cpu").model.depth == 4


def test_speedrun_preset_matches_record_shape():
    cfg = load_preset("speedrun-124m")
    assert cfg.model.resolved_dim() == 768 and cfg.model.resolved_heads() == 6
    assert cfg.model.padded_vocab() == 50304
    assert micro_batch_rows(cfg, 1) == (1, 8)
    assert micro_batch_rows(cfg, 8) == (1, 1)
    # the speed switches chosen by H100 A/Bs (docs/benchmarks.md); each falls back off the GPU
    m = cfg.model
    assert m.fp8_head and m.fused_ce and m.fp8_mlp and m.fp8_scaling == "rowwise" and m.fp8_mlp_fused_act
    assert m.fp8_attn and cfg.train.persistent_reductions_upto == 1024


def test_depth_knob_derives_width_and_heads():
    cfg = apply_overrides(load_preset("tiny-cpu"), ["--model.model_dim=0", "--model.head_dim=128",
                                                     "--model.depth=12", "--model.aspect_ratio=64"])
    assert cfg.model.resolved_dim() == 768 and cfg.model.resolved_heads() == 6
    cfg = apply_overrides(cfg, ["--model.depth=20"])
    assert cfg.model.resolved_dim() == 1280 and cfg.model.resolved_heads() == 10


@pytest.mark.parametrize("override,fragment", [
    (["--model.depthh=3"], "unknown config key 'model.depthh'"),
    (["--modell.depth=3"], "unknown config section 'modell'"),
    (["--model.depth=three"], "model.depth: expected int"),
    (["--optim.muon_lr=true"], "optim.muon_lr: expected float"),
    (["--model.unet_skips=1"], "model.unet_skips: expected bool"),
    (["model_depth=3"], "must look like --section.key=value"),
])
def test_override_errors_name_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        apply_overrides(load_preset("tiny-cpu"), override)


@pytest.mark.parametrize("override,fragment", [
    (["--model.num_heads=3"], "does not divide model.model_dim=128"),
    (["--train.batch_tokens=1000"], "not divisible by data.seq_len=128"),
    (["--train.micro_batch_size=3"], "does not divide the 8 rows"),
    (["--model.attn_backend=cuda"], "must be one of auto, sdpa, flex"),
    (["--model.attn_free_layers=[9]"], "outside 0..3"),
    (["--schedule.cooldown_frac=1.5"], r"schedule.cooldown_frac=1.5 must lie in \[0, 1\]"),
    (["--train.log_every=0"], "train.log_every=0 must be at least 1"),
    (["--train.micro_batch_size=-1"], "train.micro_batch_size=-1 must be >= 0"),
    (["--data.val_seq_len=1"], "data.val_seq_len=1 must be 0"),
    (["--schedule.window_block=0"], "schedule.window_block=0 must be at least 1"),
    (["--schedule.kind=wsd"], "is constant_cooldown with a warmup"),
    (["--parallel.grad_comm_dtype=fp16"], "parallel.grad_comm_dtype='fp16' must be param or bf16"),
    (["--run.sample_tokens=-1"], "run.sample_tokens=-1 must be >= 0"),
    # the model's float keys: a reshape error, a division by zero or a non-finite loss at step 1 before
    (["--model.mlp_ratio=0"], "model.mlp_ratio=0.0 must be finite and > 0"),
    (["--model.mlp_ratio=nan"], "model.mlp_ratio=nan must be finite and > 0"),
    (["--model.rope_base=0"], "model.rope_base=0.0 must be finite and > 0"),
    (["--model.attn_scale=nan"], "model.attn_scale=nan must be finite and >= 0"),
    (["--model.logit_softcap=-5"], "model.logit_softcap=-5.0 must be finite and >= 0"),
    (["--train.peak_flops=-1"], "train.peak_flops=-1.0 must be finite and >= 0"),  # a negative MFU was logged
    (["--train.time_budget_s=nan"], "train.time_budget_s=nan must be finite and >= 0"),  # "no limit", silently
    # (audit 29) nan passed every `< 0` check: time-based checkpoints silently off, no memory limit, a bias rate
    # of nan (a budget's nan: tests/test_budget.py)
    (["--train.checkpoint_every_min=nan"], r"train.checkpoint_every_min=nan is not a number; give a number"),
    (["--parallel.memory_limit_gib=nan"], r"parallel.memory_limit_gib=nan is not a number"),
    (["--model.moe_bias_rate=nan"], r"model.moe_bias_rate=nan is not a number"),
    (["--train.stages=[{share=nan}, {share=1.0}]"], r"train.stages\[0\].share=nan is not a number"),
    # (audit 29) the start hung in planning every step's windows (1e12), or saved an integer TOML cannot hold (1e30)
    (["--train.steps=1e12"], "train.steps=1,000,000,000,000 is more than 10,000,000, the most a plan spans"),
    # (audit 29b) past float32, in which training applies them: torch's "value cannot be converted to type float
    # without overflow" at step 1, naming no key, or an inf softcap's non-finite loss blamed on the learning rates;
    # an eps float32 rounds to 0 divided by zero (a non-finite loss at step 2)
    (["--optim.muon_lr=1e308"], r"optim.muon_lr=1e\+308 is beyond float32 \(at most 3.4e\+38\)"),
    (["--optim.embed_lr=3.5e38"], r"optim.embed_lr=3.5e\+38 is beyond float32"),
    (["--model.logit_softcap=1e308"], r"model.logit_softcap=1e\+308 is beyond float32"),
    (["--optim.adam_eps=1e-300"], r"optim.adam_eps=1e-300 is 0 in float32 \(the smallest positive is 1.4e-45\)"),
])
def test_validation_errors(override, fragment):
    cfg = apply_overrides(load_preset("tiny-cpu"), override)
    with pytest.raises(ConfigError, match=fragment):
        validate(cfg)


def test_world_size_must_divide_rows():
    cfg = apply_overrides(load_preset("tiny-cpu"), ["--train.batch_tokens=640"])  # 5 rows of 128
    validate(cfg, world_size=1)
    with pytest.raises(ConfigError, match="does not divide across 2 ranks"):
        validate(cfg, world_size=2)


@pytest.mark.parametrize("prompt", ["def f():\n    return", "tab\there", "cr\r\nlf", "back\\slash \"q\"",
                                    "del\x7f and \x01", "日本語 🙂"])
def test_toml_round_trip(tmp_path, prompt):
    """Every string a user can give survives config.toml: a run.sample_prompt with a newline once wrote a file no
    later command (resume, eval, export) could read."""
    cfg = apply_overrides(load_preset("speedrun-124m"), ['--run.name=quote"me', "--model.attn_free_layers=[3, 7]",
                                                         f"--run.sample_prompt={prompt}"])
    save_toml(cfg, tmp_path / "config.toml")
    again = load_toml(tmp_path / "config.toml")
    assert again == cfg and again.run.sample_prompt == prompt


def test_a_hand_written_file_starts_from_the_preset_it_names(tmp_path):
    """`preset = "tiny-cpu"` and a [train] table: tiny-cpu with those keys (it was read on the built-in defaults, a
    278M-parameter model saved under tiny-cpu's name); a run's complete config.toml stands alone as before; an
    unknown preset, or --preset beside --config, is refused."""
    from speedgpt.config import resolve

    (tmp_path / "my.toml").write_text('preset = "tiny-cpu"\n[train]\nsteps = 5\n')
    cfg = load_toml(tmp_path / "my.toml")
    assert cfg == apply_overrides(load_preset("tiny-cpu"), ["--train.steps=5"])
    (tmp_path / "typo.toml").write_text('preset = "tiny-cpux"\n[train]\nsteps = 5\n')
    with pytest.raises(ConfigError, match="preset 'tiny-cpux' is not a preset .*available presets: d12"):
        load_toml(tmp_path / "typo.toml")
    with pytest.raises(ConfigError, match="give --preset or --config, not both"):
        resolve("d12", str(tmp_path / "my.toml"))
    # the preset's own sections, each with a key, are still a hand-written file (no [run] or [parallel])
    (tmp_path / "mine.toml").write_text('preset = "tiny-cpu"\n[model]\ndepth = 2\n[data]\nseq_len = 128\n'
                                        '[optim]\nmuon_lr = 0.01\n[train]\nsteps = 5\n[schedule]\n')
    assert load_toml(tmp_path / "mine.toml").model.model_dim == load_preset("tiny-cpu").model.model_dim
    # a complete file whose values differ from its preset's: its own values, every one
    full = apply_overrides(load_preset("speedrun-124m"), ["--model.depth=6", "--data.seq_len=2048"])
    save_toml(full, tmp_path / "config.toml")
    assert load_toml(tmp_path / "config.toml") == full
    # a run's file stands alone whatever its label: a preset renamed or gone later still reads
    renamed = (tmp_path / "config.toml").read_text().replace('preset = "speedrun-124m"', 'preset = "gone-v0"')
    (tmp_path / "config.toml").write_text(renamed)
    assert load_toml(tmp_path / "config.toml").model.depth == 6


def test_missing_and_broken_config_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_toml(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[model\ndepth=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(tmp_path / "bad.toml")
    (tmp_path / "binary.toml").write_bytes(b"\x00\x01junk\xff\xfe")  # not even UTF-8
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(tmp_path / "binary.toml")
    with pytest.raises(ConfigError, match="is a directory; pass a config file"):
        load_toml(tmp_path)
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_preset("nope")


def test_the_config_command_refuses_what_train_refuses(capsys):
    from speedgpt.cli import main

    assert main(["config", "--model.depth=0"]) == 2  # it printed the value and exited 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["speedgpt config: config error: model.depth=0 must be at least 1"]
    assert main(["config", "--preset", "speedrun-latest"]) == 0
    capsys.readouterr()
    assert main(["config", "--list-presets"]) == 0  # train's flag: it was refused as a malformed override
    assert capsys.readouterr().out.split() == preset_names()


def test_resume_takes_the_runs_own_preset_again_and_refuses_another(tmp_path, capsys):
    """`train --preset P --resume RUN` (the first command again) goes on with the run's config; a preset other than
    the run's is refused in one line (it was dropped without a word)."""
    from speedgpt.cli import main

    run = tmp_path / "run"
    run.mkdir()
    save_toml(load_preset("tiny-cpu"), run / "config.toml")
    assert main(["train", "--preset", "d12", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"speedgpt train: --resume {run} continues a run of preset 'tiny-cpu' with its own config; "
                   f"drop --preset d12"]
    assert main(["train", "--preset", "tiny-cpu", "--resume", str(run)]) == 2  # gets past the preset: no checkpoint
    assert "nothing to resume" in capsys.readouterr().err


@pytest.mark.parametrize("override, says", [
    ("--optim.muon_lr=-0.05", "optim.muon_lr=-0.05 must be a finite number >= 0"),  # trained the loss upward
    ("--optim.embed_lr=inf", "optim.embed_lr=inf must be a finite number >= 0"),  # failed only at step 2
    ("--optim.adam_eps=nan", "optim.adam_eps=nan must be a finite number >= 0"),
    ("--optim.muon_momentum=1.2", "optim.muon_momentum=1.2 must lie in [0, 1)"),
    ("--optim.adam_beta2=-0.1", "optim.adam_beta2=-0.1 must lie in [0, 1)"),
])
def test_nonsense_optimizer_values_are_refused(override, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        validate(apply_overrides(load_preset("tiny-cpu"), [override]))


@pytest.mark.parametrize("name", ["a/b", "..", "x\\y"])
def test_a_run_name_is_a_name_not_a_path(name, tmp_path, monkeypatch, capsys):
    """run.name names the default folder runs/<name>-<time>: a slash made nested folders."""
    from speedgpt.cli import main
    from speedgpt.rundir import default_run_dir

    with pytest.raises(ConfigError, match="must be a plain name .*--run-dir"):
        default_run_dir(apply_overrides(load_preset("tiny-cpu"), [f"--run.name={name}"]))
    monkeypatch.chdir(tmp_path)
    assert main(["train", f"--run.name={name}", "--train.steps=1"]) == 2
    assert "must be a plain name" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_resume_of_a_folder_that_does_not_exist_writes_nothing(tmp_path, capsys):
    """With --config beside it, --resume of a missing folder made it (an empty metrics.jsonl) and then failed."""
    from speedgpt.cli import main

    save_toml(load_preset("tiny-cpu"), tmp_path / "config.toml")
    assert main(["train", "--resume", str(tmp_path / "gone"), "--config", str(tmp_path / "config.toml")]) == 2
    assert f"--resume {tmp_path / 'gone'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "gone").exists()


def test_the_config_command_applies_overrides_to_the_defaults_it_names(capsys):
    """`speedgpt config --model.depth=3` printed tiny-cpu's config with depth 3 (model_dim 128 beside "(default 768)",
    preset "tiny-cpu"), while its help and `speedgpt config` alone start from the built-in defaults."""
    from speedgpt.cli import main

    assert main(["config"]) == 0
    plain = capsys.readouterr().out
    assert main(["config", "--model.depth=8"]) == 0
    out = capsys.readouterr().out
    assert "model.depth = 8 (default 12)" in out and 'preset = ""' in out and "tiny-cpu" not in out
    changed = [a for a, b in zip(plain.splitlines(), out.splitlines()) if a != b]
    assert changed == ["model.depth = 12"], changed  # the override is the only difference
    # depth 3 is refused on the defaults (their 3 value embeddings need 6 layers), as train refuses it there
    assert main(["config", "--model.depth=3"]) == 2
    assert "model.value_embeds=3 needs depth >= 6" in capsys.readouterr().err
