"""train.compile_validation_ahead (speedgpt/train/validation_ahead.py): a cold start's validation graph compiled by a
helper process into the run's compile cache, where the trainer's own validation compile then finds it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from speedgpt.config import apply_overrides, load_preset
from speedgpt.train.validation_ahead import LOG_NAME, why_not
from conftest import TINY_OVERRIDES


def test_only_a_cold_compiled_start_of_one_process_starts_the_helper(tmp_path):
    cfg = apply_overrides(load_preset("tiny-cpu"), ["--train.compile=true", "--train.warmup_steps=1"])
    cold = SimpleNamespace(artifacts=tmp_path / "none.bin")
    warm = SimpleNamespace(artifacts=tmp_path / "saved.bin")
    warm.artifacts.write_bytes(b"x")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    def reason(extra=(), world=1, device=cuda, strategy="ddp", cache=cold, room=True):
        return why_not(apply_overrides(cfg, list(extra)), world, device, strategy, cache, lambda: room)

    assert reason() is None
    assert reason(device=cpu) == "not a CUDA device (on to force)"
    assert reason(["--train.compile_validation_ahead=on"], device=cpu) is None
    assert reason(["--train.compile_validation_ahead=off"]) == "off"
    assert reason(cache=warm) == "warm cache"
    assert reason(world=2) == "several processes"
    assert reason(room=False) == "less GPU memory free than twice the run's memory estimate (on to force)"
    assert reason(["--train.compile_validation_ahead=on"], room=False) is None
    assert reason(["--train.warmup_steps=0"]) == "no warmup to compile validation in"
    assert reason(["--train.compile_scope=block"]) == "blocks compiled one by one"
    assert reason(strategy="fsdp") == "blocks compiled one by one"
    for extra in (["--train.compile=false"], ["--train.compile_backend=aot_eager"]):
        assert reason(extra) == "nothing compiled into a cache"
    assert reason(cache=None) == "nothing compiled into a cache"

    def no_gpu_to_ask():
        raise AssertionError("room asked where the answer is not needed")

    for extra, world in ((["--train.compile_validation_ahead=off"], 1), ([], 2),
                         (["--train.compile_validation_ahead=on"], 1)):
        why_not(apply_overrides(cfg, extra), world, cuda, "ddp", cold, no_gpu_to_ask)  # the GPU is not asked


def test_a_bad_value_is_one_line():
    from speedgpt.config import ConfigError
    from speedgpt.config.validate import check_config

    with pytest.raises(ConfigError, match="must be auto, on or off"):
        check_config(apply_overrides(load_preset("tiny-cpu"), ["--train.compile_validation_ahead=yes"]))


def test_the_helpers_validation_graph_is_the_trainers_cache_hit(text_shards, tmp_path, monkeypatch):
    """Inductor on the CPU, helper forced on: the trainer's validation warmup finds its compiled graph in the
    cache the helper filled (a hit in the validation span, none in training's), and the helper is gone after."""
    from speedgpt.train.loop import Trainer

    # activate() sets these for the process: set first here, so that the test's end puts them back
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused-inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused-triton"))
    # Inductor's CPU kernels are keyed by the thread count: the helper process gets this process's, whatever an
    # earlier test in it set (test_chat_sft.py's one thread made this test fail when run after it in one process).
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    cfg = apply_overrides(load_preset("tiny-cpu"), TINY_OVERRIDES + [
        f"--data.train_files={text_shards}", "--model.model_dim=32", "--train.compile=true",
        "--train.warmup_steps=1", "--train.compile_validation_ahead=on", f"--train.compile_cache={tmp_path / 'cache'}"])
    torch._dynamo.reset()
    lines = []
    try:
        with torch._dynamo.config.patch(caching_precompile=False):
            trainer = Trainer(cfg, run_dir=tmp_path / "run", quiet=True)
            trainer.log = lines.append
            trainer.setup()
            helper = trainer.validation_ahead
            assert helper is not None
            trainer.warmup_then_reset()
            trainer.compile_watch.close()
    finally:
        torch._dynamo.reset()
    assert trainer.validation_ahead is None and helper.process.returncode == 0
    assert not helper.config_file.exists()
    assert any("validation's graph compiled ahead by a helper process" in line for line in lines), lines
    assert trainer.validation_ahead_note in lines  # bench prints it
    helper_log = Path(tmp_path / "run" / LOG_NAME).read_text()
    assert "trainer set up in" in helper_log and "validation compiled and run once" in helper_log
    spans = {s.label: s.breakdown() for s in trainer.compile_watch.spans}
    assert spans["validation"]["fx_cache_hits"] >= 1, spans
    assert spans["training"]["fx_cache_hits"] == 0, spans


def test_a_failed_helper_is_one_line_and_a_running_one_is_stopped(tmp_path):
    """wait(): the helper's exit status decides the line (a failure names its log; the trainer then compiles
    validation itself); stop(): a helper still running when the warmup fails is ended. Its config file goes
    either way."""
    import subprocess
    import sys

    from speedgpt.train.validation_ahead import ValidationAhead

    def helper(code: str) -> ValidationAhead:
        config = tmp_path / f"config-{len(list(tmp_path.iterdir()))}.toml"
        config.write_text("")
        # in a session of its own, as start() makes it; SIGTERM unblocked, as the helper makes it first thing
        # (a CI worker's blocked SIGTERM is inherited)
        prelude = "import signal; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}); "
        process = subprocess.Popen([sys.executable, "-c", prelude + code], start_new_session=True)
        return ValidationAhead(process, config, tmp_path / LOG_NAME)

    failed = helper("raise SystemExit(3)")
    line = failed.wait()
    assert "failed (exit 3" in line and str(tmp_path / LOG_NAME) in line and "\n" not in line
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


def test_the_line_says_when_the_helper_exited_not_when_the_trainer_looked(tmp_path):
    """A helper done before the trainer's validation warmup: its line's "done" is its exit, which a thread notes
    (wave 21's lines gave the time of the trainer's wait instead)."""
    import re
    import subprocess
    import sys
    import time

    from speedgpt.train.validation_ahead import ValidationAhead

    config = tmp_path / "config.toml"
    config.write_text("")
    helper = ValidationAhead(subprocess.Popen([sys.executable, "-c", "pass"]), config, tmp_path / LOG_NAME)
    for _ in range(1200):  # its exit, noted (a minute at most)
        if helper.finished is not None:
            break
        time.sleep(0.05)
    assert helper.finished is not None
    seen = time.perf_counter()
    time.sleep(0.3)  # the trainer looks later
    line = helper.wait()
    took = float(re.search(r"done ([0-9.]+)s after it started", line).group(1))
    assert took <= seen - helper.started + 0.05, line


def test_a_helper_that_cannot_start_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    import tempfile

    from speedgpt.train.validation_ahead import ValidationAhead

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    lines = []
    cfg = load_preset("tiny-cpu")
    assert ValidationAhead.start(cfg, tmp_path / "no-such-run-folder", lines.append) is None
    assert len(lines) == 1 and "did not start" in lines[0] and "validation compiles here" in lines[0]
    assert list((tmp_path / "tmp").iterdir()) == []  # its config file removed


def test_the_helper_program_started_by_hand_is_one_line():
    """It runs only as its trainer's child: no arguments, or a pid that is not its parent's, exit 1 with one line."""
    import subprocess
    import sys

    for args, says in (([], "usage: python -m speedgpt.train.validation_helper CONFIG TRAINER_PID"),
                       (["no-such.toml", "999999999"], "its trainer (pid 999999999) is not its parent")):
        done = subprocess.run([sys.executable, "-m", "speedgpt.train.validation_helper", *args], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        assert done.returncode == 1 and says in done.stderr and done.stderr.count("\n") == 1, done.stderr
