"""train.compile_validation_ahead and train.compile_backward_ahead (speedgpt/train/compile_ahead.py): a cold start's
validation graph and training's backward graph compiled by helper processes into the run's compile cache, where the
trainer's own compiles of them then find them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from speedgpt.config import apply_overrides, load_preset
from speedgpt.train.compile_ahead import PARTS, log_name, why_not
from conftest import TINY_OVERRIDES


def test_only_a_cold_compiled_start_of_one_process_starts_the_helpers(tmp_path):
    cfg = apply_overrides(load_preset("tiny-cpu"), ["--train.compile=true", "--train.warmup_steps=1"])
    cold = SimpleNamespace(artifacts=tmp_path / "none.bin")
    warm = SimpleNamespace(artifacts=tmp_path / "saved.bin")
    warm.artifacts.write_bytes(b"x")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    for part, key in (("validation", "compile_validation_ahead"), ("backward", "compile_backward_ahead")):
        def reason(extra=(), world=1, device=cuda, strategy="ddp", cache=cold, room=True):
            return why_not(apply_overrides(cfg, list(extra)), part, world, device, strategy, cache, room)

        assert reason() is None
        assert reason(device=cpu) == "not a CUDA device (on to force)"
        assert reason([f"--train.{key}=on"], device=cpu) is None
        assert reason([f"--train.{key}=off"]) == "off"
        other = "compile_backward_ahead" if part == "validation" else "compile_validation_ahead"
        assert reason([f"--train.{other}=off"]) is None  # each part its own switch
        assert reason(cache=warm) == "warm cache"
        assert reason(world=2) == "several processes"
        assert reason(room=False) == "less GPU memory free than twice the run's memory estimate (on to force)"
        assert reason([f"--train.{key}=on"], room=False) is None
        assert reason(["--train.warmup_steps=0"]) == "no warmup to compile in"
        assert reason(["--train.compile_scope=block"]) == "blocks compiled one by one"
        assert reason(strategy="fsdp") == "blocks compiled one by one"
        for extra in (["--train.compile=false"], ["--train.compile_backend=aot_eager"]):
            assert reason(extra) == "nothing compiled into a cache"
        assert reason(cache=None) == "nothing compiled into a cache"


def test_a_bad_value_is_one_line():
    from speedgpt.config import ConfigError
    from speedgpt.config.validate import check_config

    for key in ("compile_validation_ahead", "compile_backward_ahead"):
        with pytest.raises(ConfigError, match=f"train.{key}='yes' must be auto, on or off"):
            check_config(apply_overrides(load_preset("tiny-cpu"), [f"--train.{key}=yes"]))


def test_the_helpers_graphs_are_the_trainers_cache_hits(text_shards, tmp_path, monkeypatch):
    """Inductor on the CPU, both helpers forced on: the trainer's first backward and its validation warmup find
    their compiled graphs in the cache the helpers filled (training's span: the backward a hit, the forward a miss,
    as nothing of the backward helper's skipped forward reaches a cache), and the helpers are gone after."""
    from speedgpt.train.loop import Trainer

    # activate() sets these for the process: set first here, so that the test's end puts them back
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused-inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused-triton"))
    cfg = apply_overrides(load_preset("tiny-cpu"), TINY_OVERRIDES + [
        f"--data.train_files={text_shards}", "--model.model_dim=32", "--train.compile=true",
        "--train.warmup_steps=1", "--train.compile_validation_ahead=on", "--train.compile_backward_ahead=on",
        f"--train.compile_cache={tmp_path / 'cache'}"])
    torch._dynamo.reset()
    lines = []
    try:
        with torch._dynamo.config.patch(caching_precompile=False):
            trainer = Trainer(cfg, run_dir=tmp_path / "run", quiet=True)
            trainer.log = lines.append
            trainer.setup()
            helpers = dict(trainer.compile_ahead)
            assert sorted(helpers) == sorted(PARTS)
            trainer.warmup_then_reset()
            trainer.compile_watch.close()
    finally:
        torch._dynamo.reset()
    assert trainer.compile_ahead == {} and len(trainer.compile_ahead_notes) == 2  # bench prints these
    for helper in helpers.values():
        assert helper.process.returncode == 0 and not helper.config_file.exists()
    for what in ("training's backward graph", "validation's graph"):
        assert any(f"{what} compiled ahead by a helper process" in line for line in lines), lines
    assert "validation compiled and run once" in (tmp_path / "run" / log_name("validation")).read_text()
    assert "training's backward graph compiled in" in (tmp_path / "run" / log_name("backward")).read_text()
    spans = {s.label: s.breakdown() for s in trainer.compile_watch.spans}
    assert spans["validation"]["fx_cache_hits"] >= 1, spans
    assert spans["training"]["fx_cache_hits"] == 1 and spans["training"]["fx_cache_misses"] == 1, spans


def test_a_failed_helper_is_one_line_and_a_running_one_is_stopped(tmp_path):
    """wait(): the helper's exit status decides the line (a failure names its log; the trainer then compiles
    validation itself); stop(): a helper still running when the warmup fails is ended. Its config file goes
    either way."""
    import subprocess
    import sys

    from speedgpt.train.compile_ahead import CompileAhead

    def helper(code: str) -> CompileAhead:
        config = tmp_path / f"config-{len(list(tmp_path.iterdir()))}.toml"
        config.write_text("")
        # in a session of its own, as start() makes it; SIGTERM unblocked, as the helper makes it first thing
        # (a CI worker's blocked SIGTERM is inherited)
        prelude = "import signal; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}); "
        process = subprocess.Popen([sys.executable, "-c", prelude + code], start_new_session=True)
        return CompileAhead("validation", process, config, tmp_path / log_name("validation"))

    failed = helper("raise SystemExit(3)")
    line = failed.wait()
    assert "validation helper failed (exit 3" in line and str(tmp_path / log_name("validation")) in line
    assert "validation compiles here" in line and "\n" not in line
    assert not failed.config_file.exists()
    done = helper("pass")
    assert "compiled ahead" in done.wait()
    running = helper("import time; time.sleep(600)")
    running.stop()
    assert running.process.returncode is not None and not running.config_file.exists()
    slow = helper("import time; time.sleep(600)")
    line = slow.wait(timeout_s=0.5)  # a helper that hangs holds the trainer this long at most
    assert "stopped (not done after 0s of waiting)" in line and slow.process.returncode is not None
    stopping = helper("import time; time.sleep(600)")
    assert "stopped (the run is stopping)" in stopping.wait(stopping=lambda: True)
    assert stopping.process.returncode is not None and not stopping.config_file.exists()


def test_a_helper_that_cannot_start_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    import tempfile

    from speedgpt.train.compile_ahead import CompileAhead

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    lines = []
    cfg = load_preset("tiny-cpu")
    assert CompileAhead.start("backward", cfg, tmp_path / "no-such-run-folder", lines.append) is None
    assert len(lines) == 1 and "backward helper did not start" in lines[0]
    assert "the backward compiles here" in lines[0]
    assert list((tmp_path / "tmp").iterdir()) == []  # its config file removed
