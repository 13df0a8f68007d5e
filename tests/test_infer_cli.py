"""load_model and `speedgpt sample`, in-process through speedgpt.cli.main."""

from __future__ import annotations

import shutil

import pytest
import torch

from evalkit import make_run
from speedgpt.cli import main
from speedgpt.infer.generate import sample_texts
from speedgpt.device import DeviceError, resolve_device
from speedgpt.infer.load import LoadError, load_model, locate
from speedgpt.optim.schedules import attention_windows


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path, steps=(1, 2))


def test_load_model_latest_or_named(run):
    model, cfg = load_model(run)
    assert not model.training
    assert model.windows == attention_windows(cfg.schedule, cfg.train.steps, cfg.train.steps) == (64, 16)
    assert locate(run).step == 2
    for name in (1, "1", "step_000001", str(run / "checkpoints" / "step_000001")):
        assert locate(run, name).step == 1
    assert locate(run, "latest").step == 2  # the --checkpoint help's name for the default; it was refused
    one, _ = load_model(run, checkpoint=1)
    assert not torch.equal(one.embed.weight, model.embed.weight)


def test_load_model_errors(tmp_path, run):
    with pytest.raises(LoadError, match="does not exist"):
        load_model(tmp_path / "missing")
    with pytest.raises(LoadError, match="is a file"):
        load_model(run / "config.toml")
    with pytest.raises(LoadError, match="neither config.toml"):
        load_model(tmp_path / "data")
    with pytest.raises(LoadError, match="available steps: 1, 2"):
        load_model(run, checkpoint=3)
    state = run / "checkpoints" / "step_000002" / "state.json"
    kept = state.read_text()
    state.write_text("[]")  # valid JSON of another shape: it was an AttributeError naming no file
    with pytest.raises(LoadError, match=r"state.json is corrupt \(a JSON list, not an object\); name an earlier one"):
        load_model(run)
    state.write_text(kept)
    (run / "checkpoints" / "step_000002" / "model.pt").write_bytes(b"garbage")
    with pytest.raises(LoadError, match="model.pt is truncated: 7 bytes, .* name another with --checkpoint STEP"):
        load_model(run)
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(LoadError, match="has no checkpoint"):
        load_model(run)
    with pytest.raises(DeviceError, match="not a torch device"):
        resolve_device("gpu0")


def test_sample_streams_one_prompt(run, capsys):
    assert main(["sample", str(run), "--prompt", "def f(x):", "--max-tokens", "12", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    model, _ = load_model(run)
    (expected,) = sample_texts(model, ["def f(x):"], max_new_tokens=12, temperature=0.8, top_k=50, seed=4)
    assert out == expected + "\n"
    assert len(expected) > len("def f(x):")


def test_sample_batches_prompts_and_cache_matches_no_cache(run, capsys):
    prompts = ["import os", "class Tree(object):\n    def", ""]
    argv = ["sample", str(run), "--max-tokens", "10", "--temperature", "0"]
    for p in prompts:
        argv += ["--prompt", p]
    assert main(argv) == 0
    cached = capsys.readouterr().out
    assert main(argv + ["--no-cache"]) == 0
    assert capsys.readouterr().out == cached
    model, _ = load_model(run)
    for i, p in enumerate(prompts):
        (alone,) = sample_texts(model, [p], max_new_tokens=10, temperature=0.0)
        assert f"--- sample {i + 1}/3 ---\n{alone}\n" in cached


def test_sample_from_an_export(run, tmp_path, capsys):
    assert main(["export", str(run), "--out", str(tmp_path / "exp"), "--dtype", "fp32"]) == 0
    capsys.readouterr()
    argv = ["--prompt", "x = ", "--max-tokens", "8", "--temperature", "0"]
    assert main(["sample", str(run), *argv]) == 0
    from_run = capsys.readouterr().out
    assert main(["sample", str(tmp_path / "exp"), *argv]) == 0
    assert capsys.readouterr().out == from_run


def test_sample_errors(run, capsys):
    assert main(["sample", str(run), "--prompt", "x " * 100]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "does not fit the model's context of 64" in err
    assert len(err.strip().splitlines()) == 1, err  # no note about "0 new tokens" before the error
    assert main(["sample", str(run.parent / "nope"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_sample_says_when_the_context_is_shorter_than_max_tokens(run, capsys):
    """--max-tokens past the model's context stopped at the context without a word."""
    model, _ = load_model(run)
    context = model.rotary.max_seq_len
    assert main(["sample", str(run), "--prompt", "x", "--max-tokens", str(context + 50), "--seed", "4"]) == 0
    err = capsys.readouterr().err
    assert f"the model's context is {context} tokens, so a continuation stops after {context - 2} new tokens" in err
    assert main(["sample", str(run), "--prompt", "x", "--max-tokens", "4", "--seed", "4"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["sample", "chat"])
@pytest.mark.parametrize("flag, value, says", [
    ("--seed", "99999999999999999999999", "--seed 99999999999999999999999: must be 0 <= seed < 2**63"),
    ("--seed", str(2**63), "must be 0 <= seed < 2**63"),
    ("--seed", "-1", "must be 0 <= seed < 2**63"),
    ("--temperature", "inf", "--temperature inf: must be a finite number >= 0"),
    ("--temperature", "nan", "--temperature nan: must be a finite number >= 0"),
    ("--temperature", "1e-300", "--temperature 1e-300: below float32's smallest normal number"),  # torch's nan error
])
def test_sampling_options_out_of_range_are_one_line_before_loading(run, capsys, command, flag, value, says):
    """A seed torch cannot take was "Overflow when unpacking long long"; inf was accepted (nan logits)."""
    with pytest.raises(SystemExit) as e:
        main([command, str(run), "--prompt", "hi", flag, value])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and says in err and "note:" not in err and "Overflow" not in err
