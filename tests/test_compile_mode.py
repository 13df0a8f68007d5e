"""train.compile_mode: torch.compile's mode reaches every compile call (whole model and per block), a wrong mode or
one for a backend without modes is a config error, and with CUDA graphs each training micro-step and validation
batch marks a new cudagraph step (torch's static output buffers may then be overwritten by the next replay), and
the first micro-step's gradients leave those buffers.
CUDA graphs themselves run on a GPU only: scripts/gpu_check_cudagraphs.py checks their gradients there."""

from __future__ import annotations

import pytest
import torch

from speedgpt.config import Config, ConfigError, apply_overrides, check_cudagraph_strategy, load_preset
from speedgpt.train import compile as compile_module
from speedgpt.train import loop, validation

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder:
    """torch.compile in place: notes each call's keyword arguments and hands back the callable uncompiled."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, fn, **kwargs):
        self.calls.append(kwargs)
        return fn


@pytest.mark.parametrize("scope", ["model", "block"])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_the_mode_reaches_every_compile_call(scope, mode, monkeypatch):
    from speedgpt.model.build import build_model

    cfg = apply_overrides(load_preset("tiny-cpu"), ["--model.depth=2", "--model.model_dim=64", "--model.head_dim=16",
                                                    "--train.compile=true", f"--train.compile_mode={mode}",
                                                    f"--train.compile_scope={scope}"])
    recorder = Recorder()
    monkeypatch.setattr(torch, "compile", recorder)
    lines: list[str] = []
    compile_module.compiled_forward(cfg, build_model(cfg.model, 32, "cpu", seed=0), "ddp", lines.append)
    assert len(recorder.calls) == (1 if scope == "model" else 2)
    assert {call["mode"] for call in recorder.calls} == {None if mode == "default" else mode}
    assert any(mode in line for line in lines) == (mode != "default")


def test_a_wrong_mode_or_one_that_cannot_apply_is_refused_with_the_fix():
    from speedgpt.plan import validate

    with pytest.raises(ConfigError, match="must be one of default, reduce-overhead"):
        validate(apply_overrides(Config(), ["--train.compile_mode=fast"]))
    with pytest.raises(ConfigError, match="--train.compile_backend=inductor or --train.compile_mode=default"):
        validate(apply_overrides(Config(), ["--train.compile=true", "--train.compile_mode=reduce-overhead",
                                            "--train.compile_backend=eager"]))
    with pytest.raises(ConfigError, match="give --train.compile=true or --train.compile_mode=default"):
        validate(apply_overrides(Config(), ["--train.compile_mode=reduce-overhead"]))
    with pytest.raises(ConfigError, match="not tried under fsdp.*--parallel.strategy=ddp"):
        validate(apply_overrides(Config(), ["--train.compile=true", "--train.compile_mode=reduce-overhead",
                                            "--parallel.strategy=fsdp"]))
    validate(apply_overrides(Config(), ["--train.compile=true", "--train.compile_mode=reduce-overhead"]))
    validate(apply_overrides(Config(), ["--train.compile=true", "--train.compile_mode=max-autotune-no-cudagraphs",
                                        "--parallel.strategy=fsdp"]))
    check_cudagraph_strategy(apply_overrides(Config(), ["--train.compile=true"]).train, "fsdp", chosen=True)
    with pytest.raises(ConfigError, match="parallel.strategy=auto chose"):  # auto's choice, before the run dir
        check_cudagraph_strategy(
            apply_overrides(Config(), ["--train.compile=true", "--train.compile_mode=reduce-overhead"]).train, "fsdp",
            chosen=True)


@pytest.mark.parametrize("mode,marks", [("reduce-overhead", True), ("max-autotune", True), ("default", False),
                                        ("max-autotune-no-cudagraphs", False)])
def test_with_cuda_graphs_each_micro_step_and_validation_batch_marks_a_step(mode, marks, text_shards, tmp_path,
                                                                            monkeypatch):
    """An eager run (torch.compile recorded, not applied) that counts the marks: 3 steps of 2 micro-steps each, and
    every validation batch the trainer scores (2 a validation)."""
    monkeypatch.setattr(torch, "compile", Recorder())
    counted = {"training": 0, "validation": 0}

    def counter(where):
        def mark():
            counted[where] += 1
        return mark

    events = []  # the training loop's marks and gradient copies, in order
    mark_training, mark_validation = counter("training"), counter("validation")

    def mark():  # the compiled forward marks before each call; validation runs without grad
        if torch.is_grad_enabled():
            events.append("mark")
            mark_training()
        else:
            mark_validation()

    monkeypatch.setattr(compile_module, "mark_cudagraph_step", mark)
    copy_grads = compile_module.grads_out_of_cudagraph_pool
    monkeypatch.setattr(loop, "grads_out_of_cudagraph_pool", lambda model: (events.append("copy"), copy_grads(model)))
    batches = []
    score = validation.Validator.loss

    def counting_loss(self, model, forward, windows, rope, **kw):
        def counted_forward(*a, **k):
            batches.append(1)
            return forward(*a, **k)
        return score(self, model, counted_forward, windows, rope, **kw)

    monkeypatch.setattr(validation.Validator, "loss", counting_loss)
    cfg = apply_overrides(load_preset("tiny-cpu"), [
        "--model.depth=2", "--model.model_dim=64", "--model.head_dim=16", "--train.steps=3", "--train.val_every=2",
        "--train.batch_tokens=256", "--train.micro_batch_size=1", "--data.seq_len=128", "--data.val_tokens=256",
        "--train.compile=true", f"--train.compile_mode={mode}", "--train.compile_cache=off", "--run.report=false",
        "--run.sample_tokens=0", "--train.save_final_checkpoint=false", f"--data.train_files={text_shards}"])
    result = loop.train(cfg, run_dir=tmp_path / "run", quiet=True)
    assert len(result.val_history) >= 2 and len(batches) == 2 * len(result.val_history)
    expected = {"training": 3 * 2, "validation": len(batches)} if marks else {"training": 0, "validation": 0}
    assert counted == expected
    # the gradients leave the graphs' buffers once a step, right after its first backward (before the next
    # micro-step's replay): a copy after the loop or after the last backward would come too late
    assert events == (["mark", "copy", "mark"] * 3 if marks else [])


def test_the_gradients_leave_the_graphs_buffers_as_equal_copies():
    model = torch.nn.Linear(4, 3)
    model(torch.randn(2, 4)).square().sum().backward()
    model.bias.grad = None  # a parameter without a gradient keeps none
    before = model.weight.grad
    compile_module.grads_out_of_cudagraph_pool(model)
    assert model.weight.grad is not before and torch.equal(model.weight.grad, before)
    assert model.weight.grad.data_ptr() != before.data_ptr() and model.bias.grad is None
