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
import threading
import time
from pathlib import Path

LOG_NAME = "validation-ahead.log"
WAIT_LIMIT_S = 600.0  # the longest the trainer waits for the helper (wave 20: 55.7 s for speedrun-latest on an H100)


def why_not(cfg, world_size: int, device, strategy: str, cache, room=lambda: True) -> str | None:
    """Why this run compiles validation itself (None: the helper may start). Only a cold start of one compiled
    process gains: a warm cache holds validation's code already, and ranks would each need a helper. `room`: asks
    room_for_a_helper (the helper's model and validation batch beside the trainer's warmup), only where "auto"
    needs the answer: "on" does not ask, and a run that rules the helper out earlier asks no GPU."""
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
    if t.compile_validation_ahead == "auto" and not room():
        return "less GPU memory free than twice the run's memory estimate (on to force)"
    return None


def room_for_a_helper(cfg, device, estimate) -> bool:
    """Whether the GPU has room for the helper beside the trainer: free memory now (the trainer's model and
    optimizers in place) of at least twice the run's memory estimate, within the limit the estimate is checked
    against (parallel.memory_limit_gib, else the GPU's own; the helper needs less than the trainer: no gradients,
    nothing kept for a backward). True off CUDA."""
    if device.type != "cuda":
        return True
    import torch

    from ..parallel.memory import device_memory_limit

    within_limit = device_memory_limit(cfg, device) - torch.cuda.memory_reserved(device)
    free = min(torch.cuda.mem_get_info(device)[0], within_limit)
    return free >= 2 * estimate.total


class ValidationAhead:
    """The helper process of one run: started in the trainer's setup, waited for before its validation warmup."""

    def __init__(self, process: subprocess.Popen, config_file: Path, log_file: Path):
        self.process, self.config_file, self.log_file = process, config_file, log_file
        self.started = time.perf_counter()
        # when it exited, not when the trainer looked: a helper done early is seen only at the trainer's wait
        self.finished: float | None = None
        threading.Thread(target=self._note_exit, daemon=True).start()

    def _note_exit(self) -> None:
        self.process.wait()  # poll() elsewhere answers None until this wait has set the returncode
        self.finished = time.perf_counter()

    @classmethod
    def start(cls, cfg, run_dir: Path, log) -> ValidationAhead | None:
        """Start the helper on `cfg` (the run's resolved config); it inherits this process's environment, so the
        compile cache's folders (CompileCache.activate) and the visible devices are the run's. None, with a line
        to `log`, where it cannot start: the run then compiles validation itself."""
        from ..config.files import save_toml

        config_file = None
        try:
            fd, name = tempfile.mkstemp(prefix="speedgpt-validation-ahead-", suffix=".toml")
            os.close(fd)
            config_file = Path(name)
            save_toml(cfg, config_file)
            log_file = run_dir / LOG_NAME
            with open(log_file, "w") as out:
                # a session of its own: a Ctrl-C at the terminal is the trainer's to handle (train/preempt.py); the
                # helper sets up its own signals (validation_helper.py), so no preexec_fn (unsafe beside threads)
                process = subprocess.Popen([sys.executable, "-m", "speedgpt.train.validation_helper",
                                            str(config_file), str(os.getpid())], stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except (OSError, ValueError) as e:
            if config_file is not None:
                config_file.unlink(missing_ok=True)
            log(f"compile: the validation helper did not start ({type(e).__name__}: {e}): validation compiles here, "
                "after training's")
            return None
        return cls(process, config_file, log_file)

    def wait(self, stopping=lambda: False, timeout_s: float = WAIT_LIMIT_S) -> str:
        """Wait for the helper, at most `timeout_s` and only while `stopping()` is false (a stop signal to the
        trainer); a line for the log. A helper that is not done then is stopped: the trainer compiles validation."""
        t0 = time.perf_counter()
        try:
            while self.process.poll() is None:
                if stopping() or time.perf_counter() - t0 > timeout_s:
                    why = "the run is stopping" if stopping() else f"not done after {timeout_s:.0f}s of waiting"
                    self.stop()
                    return (f"compile: the validation helper was stopped ({why}): validation compiles here, "
                            "after training's")
                time.sleep(0.2)
        finally:
            self.config_file.unlink(missing_ok=True)
        waited, took = time.perf_counter() - t0, (self.finished or time.perf_counter()) - self.started
        if self.process.returncode == 0:
            return (f"compile: validation's graph compiled ahead by a helper process (done {took:.1f}s after it "
                    f"started; waited {waited:.1f}s for it)")
        return (f"compile: the validation helper failed (exit {self.process.returncode}; {self.log_file}): "
                "validation compiles here, after training's")

    def stop(self) -> None:
        """End the helper if it still runs (a run that ends before its validation warmup): SIGTERM, then SIGKILL
        after a grace of 10 s."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)  # the helper exits through its handler: its run folder is removed
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
        self.config_file.unlink(missing_ok=True)

    def _signal(self, signum: int) -> None:
        """The helper's whole session (it leads one: its Inductor compile workers are in it), else the helper."""
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError, AttributeError):
            self.process.send_signal(signum)


def end_with_the_trainer(trainer_pid: int) -> None:
    """Called by the helper first: SIGTERM ends it through SystemExit (so its temporary run folder is removed),
    unblocked (a process may start it with the signal blocked, which a child inherits: a CI worker did); on Linux
    it gets that SIGTERM when the trainer's process dies (a killed run leaves no helper compiling)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if sys.platform == "linux":
        import ctypes
        import ctypes.util

        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG,
                                                                                              signal.SIGTERM)
        except OSError:
            pass  # no libc to ask (a musl build, say): the trainer's stop() still ends it
    if os.getppid() != trainer_pid:  # the trainer died before the request above (or a start by hand)
        sys.exit(f"validation helper: its trainer (pid {trainer_pid}) is not its parent: nothing to compile for")
