"""A later-record switch that would silently do nothing without its base is a one-line config error
naming the key to set (speedgpt/config/switch_bases.py); with its base it validates as before."""

import pytest

from speedgpt.config import ConfigError, apply_overrides, load_preset, preset_names
from speedgpt.plan import validate


# (case, overrides on tiny-cpu that turn a switch on without its base, a key the error must name)
WITHOUT_BASE = [
    ("value_embed_gates-without-value-embeds", ["--model.value_embed_gates=true", "--model.value_embeds=0"],
     "model.value_embeds"),
    ("value_embed_gates-on-attention-free-layers-only",
     ["--model.value_embed_gates=true", "--model.value_embeds=1", "--model.attn_free_layers=[0,3]"],
     "model.value_embeds"),
    ("value_embed_layers-on-an-attention-free-layer",
     ["--model.value_embed_layers=[0,2]", "--model.attn_free_layers=[2]"], "model.value_embed_layers"),
    ("skip_gates-without-unet-skips", ["--model.skip_gates=true", "--model.unet_skips=false"], "model.unet_skips"),
    ("skip_gates-at-depth-1", ["--model.skip_gates=true", "--model.depth=1", "--model.value_embeds=0"],
     "model.unet_skips"),
    ("backout-at-the-last-block", ["--model.backout_layer=3"], "model.backout_layer"),
    ("key_offset-without-long-window-layers", ["--model.key_offset=true", "--model.window_pattern=S"],
     "model.window_pattern"),
    ("key_offset-long-layers-attention-free",
     ["--model.key_offset=true", "--model.window_pattern=LS", "--model.attn_free_layers=[0,2]"],
     "model.window_pattern"),
    ("mimetic-without-attention", ["--model.mimetic_vo_beta=0.05", "--model.attn_free_layers=[0,1,2,3]"],
     "model.attn_free_layers"),
    ("yarn-without-attention", ["--model.yarn=true", "--model.attn_free_layers=[0,1,2,3]",
                                "--schedule.window_start=64"], "model.attn_free_layers"),
    ("yarn-with-a-constant-window", ["--model.yarn=true"], "schedule.window_end"),
    ("yarn-with-constant-stage-windows",
     ["--model.yarn=true", "--train.stages=[{share=0.5, window_long=64}, {share=0.5, window_long=64}]"],
     "schedule.window_end"),
    ("adam_every-beyond-the-run", ["--optim.adam_every=8", "--train.steps=5"], "optim.adam_every"),
    ("stage-window_short-without-short-layers",
     ["--train.stages=[{share=1.0, window_long=128, window_short=64}]"], "model.window_pattern"),
    ("stage-mtp-weight-zero-at-both-ends",
     ["--train.stages=[{share=1.0, mtp_weights=[1.0, 0.5, 0.0], mtp_weights_end=[1.0, 0.25, 0.0]}]"],
     "mtp_weights"),
    ("stage-mtp-constant-zero-weight", ["--train.stages=[{share=1.0, mtp_weights=[1.0, 0.0]}]"], "mtp_weights"),
]

# The same switches with their base: each validates.
WITH_BASE = [
    ["--model.value_embed_gates=true"],  # tiny-cpu's value_embeds=1
    ["--model.value_embed_gates=true", "--model.value_embeds=0", "--model.value_embed_layers=[1]"],
    ["--model.skip_gates=true"],
    ["--model.backout_layer=2"],
    ["--model.key_offset=true", "--model.window_pattern=SL"],
    ["--model.mimetic_vo_beta=0.05", "--model.attn_free_layers=[1]"],
    ["--model.yarn=true", "--schedule.window_start=64"],
    ["--model.yarn=true", "--schedule.window_rule=record28"],
    ["--model.yarn=true", "--train.stages=[{share=0.5, window_long=64}, {share=0.5}]"],
    ["--optim.adam_every=5", "--train.steps=5"],
    ["--model.window_pattern=LS", "--train.stages=[{share=1.0, window_long=128, window_short=64}]"],
    ["--train.stages=[{share=1.0, mtp_weights=[1.0, 0.5, 0.25], mtp_weights_end=[1.0, 0.5, 0.0]}]"],
    ["--train.stages=[{share=1.0, mtp_weights=[1.0, 0.0, 0.5]}]"],  # a zero in the middle keeps its place
]


@pytest.mark.parametrize("overrides, key", [case[1:] for case in WITHOUT_BASE], ids=[c[0] for c in WITHOUT_BASE])
def test_a_switch_without_its_base_is_a_one_line_error_naming_the_key(overrides, key):
    cfg = apply_overrides(load_preset("tiny-cpu"), overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    message = str(err.value)
    assert "\n" not in message and key in message


@pytest.mark.parametrize("overrides", WITH_BASE, ids=lambda o: " ".join(o))
def test_the_same_switch_with_its_base_validates(overrides):
    validate(apply_overrides(load_preset("tiny-cpu"), overrides))


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_still_plans_on_one_and_eight_ranks(name):
    """What a run does at its start (planner.plan_run: the budget resolved, a stage table's rows fitted to the world
    size, then validate): speedrun-latest's rows of 32,768 plan on 8 ranks only once fitted."""
    from speedgpt.planner import plan_run

    for world_size in (1, 8):
        plan_run(load_preset(name), world_size)


def test_speedgpt_train_exits_with_one_line_before_building_anything(tmp_path, capsys):
    from speedgpt.cli import main

    rc = main(["train", "--preset", "tiny-cpu", "--model.value_embed_gates=true", "--model.value_embeds=0",
               f"--run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert err.strip().splitlines() == [err.strip()] and "model.value_embeds" in err
    assert not (tmp_path / "run").exists()
