"""The validation graph compiled ahead, in a helper process, while the trainer compiles training's (issue 33,
train.compile_validation_ahead).

A cold start compiles its graphs one after another in one process: training's forward and backward (in the warmup's
steps), then validation's (no grad, rows of data.val_seq_len), which shares no kernel with them: about a quarter of
speedrun-latest's cold start (wave 18: 33 s of 134). Most of a compile is single-threaded Python (dynamo, AOTAutograd,
Inductor's lowering and scheduling), so the host's other cores idle meanwhile. The helper is a second process of
the same config: it builds the same model, compiles one validation batch of each shape into the run's compile cache
(Inductor's and AOTAutograd's on-disk caches, whose keys are the graphs themselves), and exits. The trainer waits for
it just before its own validation warmup, whose compile then finds its code in those caches. The helper's program is
train/validation_helper.py.

Nothing depends on the helper: a graph the trainer traces differently misses the cache and compiles as before, and a
helper that fails costs its time and a line in the log. Its output goes to validation-ahead.log in the run's folder.
It shares the GPU with the trainer (its model, optimizers' state and one validation batch: speedrun-latest's fit
beside the trainer's warmup on an H100) and the host's cores with the trainer's kernel compiles (wave 20: the helper
took 55.7 s, the trainer's start 10.7 s less; docs/experiments.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOG_NAME = "validation-ahead.log"


def why_not(cfg, world_size: int, device, strategy: str, cache, room: bool = True) -> str | None:
    """Why this run compiles validation itself (None: the helper may start). Only a cold start of one compiled
    process gains: a warm cache holds validation's code already, and ranks would each need a helper. `room`: whether
    the device holds twice the run's memory estimate (the helper's model and validation batch beside the trainer's
    warmup); "auto" needs it, "on" does not ask."""
    t = cfg.train
    if t.compile_validation_ahead == "off":
        return "off"
    if not t.compile or t.compile_backend != "inductor" or cache is None:
        return "nothing compiled into a cache"
    if t.compile_scope != "model" or strategy == "fsdp":
        return "blocks compiled one by one"
    if t.warmup_steps <= 0:
        return "no warmup to compile validation in"
    if world_size > 1:
        return "several processes"
    if cache.artifacts.exists():
        return "warm cache"
    if t.compile_validation_ahead == "auto" and device.type != "cuda":
        return "not a CUDA device (on to force)"
    if t.compile_validation_ahead == "auto" and not room:
        return "the GPU holds less than twice the run's memory estimate (on to force)"
    return None


class ValidationAhead:
    """The helper process of one run: started in the trainer's setup, waited for before its validation warmup."""

    def __init__(self, process: subprocess.Popen, config_file: Path, log_file: Path):
        self.process, self.config_file, self.log_file = process, config_file, log_file
        self.started = time.perf_counter()

    @classmethod
    def start(cls, cfg, run_dir: Path) -> ValidationAhead:
        """Start the helper on `cfg` (the run's resolved config); it inherits this process's environment, so the
        compile cache's folders (CompileCache.activate) and the visible devices are the run's."""
        from ..config.files import save_toml

        fd, name = tempfile.mkstemp(prefix="speedgpt-validation-ahead-", suffix=".toml")
        os.close(fd)
        config_file = Path(name)
        save_toml(cfg, config_file)
        log_file = run_dir / LOG_NAME
        with open(log_file, "w") as log:
            # a session of its own: a Ctrl-C at the terminal is the trainer's to handle (train/preempt.py)
            process = subprocess.Popen([sys.executable, "-m", "speedgpt.train.validation_helper", str(config_file)],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=helper_preexec)
        return cls(process, config_file, log_file)

    def wait(self) -> str:
        """Wait for the helper; a line for the log."""
        t0 = time.perf_counter()
        try:
            rc = self.process.wait()
        finally:
            self.config_file.unlink(missing_ok=True)
        waited, took = time.perf_counter() - t0, time.perf_counter() - self.started
        if rc == 0:
            return (f"compile: validation's graph compiled ahead by a helper process (done {took:.1f}s after it "
                    f"started; waited {waited:.1f}s for it)")
        return (f"compile: the validation helper failed (exit {rc}; {self.log_file}): validation compiles here, "
                "after training's")

    def stop(self) -> None:
        """End the helper if it still runs (a run that ends before its validation warmup): SIGTERM, then SIGKILL
        after a grace of 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.config_file.unlink(missing_ok=True)


def helper_preexec() -> None:
    """In the helper, before it runs: SIGTERM at its default action, and unblocked (a process may start it with the
    signal ignored or blocked, which a child inherits: a CI worker did), so that stop() and the trainer's death end
    it; on Linux the helper gets that SIGTERM when the trainer's process dies (a killed run leaves no helper)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
