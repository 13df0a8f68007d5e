"""Graphs compiled ahead, in helper processes, while the trainer compiles training's forward (issue 33,
train.compile_validation_ahead and train.compile_backward_ahead).

A cold start compiles its graphs one after another in one process: training's forward, then its backward (lazily, at
the first backward), then validation's (no grad, rows of data.val_seq_len), which shares no kernel with them. Most of
a compile is single-threaded Python (dynamo, AOTAutograd, Inductor's lowering and scheduling), so the host's other
cores idle meanwhile. Each helper is a second process of the same config that builds the same trainer and compiles
one part into the run's compile cache (Inductor's and AOTAutograd's on-disk caches, whose keys are the graphs
themselves), then exits:
- "validation": one validation batch of each shape (wave 18: validation's graph was 33 s of speedrun-latest's 134 s
  cold start; wave 20: 10.7 s off it with the helper);
- "backward": the first warmup step's graph, traced and partitioned as the trainer does, with the forward's Inductor
  compile skipped and the backward's done at once (compile_helper.py), so the backward compiles while the trainer
  compiles the forward.
The trainer waits for each helper just before the compile it stands in for (its first backward, its validation
warmup), whose compile then finds the code in the cache. The helpers' program is train/compile_helper.py.

Nothing depends on a helper: a graph the trainer traces differently misses the cache and compiles as before, and a
helper that fails costs its time and a line in the log. Its output goes to PART-ahead.log in the run's folder. The
helpers share the GPU with the trainer (each its model and optimizers' state; the validation helper one validation
batch) and the host's cores with the trainer's kernel compiles.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTS = ("backward", "validation")
KEYS = {"backward": "compile_backward_ahead", "validation": "compile_validation_ahead"}  # train.KEY: auto|on|off
# what each part compiles, for the log, and what the trainer does without it
WHAT = {"backward": "training's backward graph", "validation": "validation's graph"}
INSTEAD = {"backward": "the backward compiles here, after the forward",
           "validation": "validation compiles here, after training's"}
WAIT_LIMIT_S = 600.0  # the longest the trainer waits for a helper (wave 20: 55.7 s for speedrun-latest's validation)


def log_name(part: str) -> str:
    return f"{part}-ahead.log"


def setting(cfg, part: str) -> str:
    """`part`'s helper switch in the config: auto | on | off."""
    return getattr(cfg.train, KEYS[part])


def why_not(cfg, part: str, world_size: int, device, strategy: str, cache, room: bool = True) -> str | None:
    """Why this run compiles `part` itself (None: its helper may start). Only a cold start of one compiled
    process gains: a warm cache holds the code already, and ranks would each need helpers. `room`:
    room_for_helpers' answer; "auto" needs it, "on" does not ask."""
    t, mode = cfg.train, setting(cfg, part)
    if mode == "off":
        return "off"
    if not t.compile or t.compile_backend != "inductor" or cache is None:
        return "nothing compiled into a cache"
    if t.compile_scope != "model" or strategy == "fsdp":
        return "blocks compiled one by one"
    if t.warmup_steps <= 0:
        return "no warmup to compile in"
    if world_size > 1:
        return "several processes"
    if cache.artifacts.exists():
        return "warm cache"
    if mode == "auto" and device.type != "cuda":
        return "not a CUDA device (on to force)"
    if mode == "auto" and not room:
        return "less GPU memory free than twice the run's memory estimate (on to force)"
    return None


def room_for_helpers(cfg, device, estimate) -> bool:
    """Whether the GPU has room for the helpers beside the trainer: free memory now (the trainer's model and
    optimizers in place) of at least twice the run's memory estimate, within the limit the estimate is checked
    against (parallel.memory_limit_gib, else the GPU's own). The helpers need less than the trainer together: each
    its model and optimizers' state, no gradients, and only the validation helper activations (one batch, no
    grad). True off CUDA."""
    if device.type != "cuda":
        return True
    import torch

    from ..parallel.memory import device_memory_limit

    within_limit = device_memory_limit(cfg, device) - torch.cuda.memory_reserved(device)
    free = min(torch.cuda.mem_get_info(device)[0], within_limit)
    return free >= 2 * estimate.total


def start_helpers(cfg, world_size: int, device, strategy: str, cache, estimate, run_dir: Path,
                  log) -> dict[str, CompileAhead]:
    """The helpers this run starts, by part (none where why_not says so; a part set to "on" that cannot run is
    one line)."""
    room = room_for_helpers(cfg, device, estimate)
    helpers = {}
    for part in PARTS:
        reason = why_not(cfg, part, world_size, device, strategy, cache, room)
        if reason and setting(cfg, part) == "on":
            log(f"compile: train.{KEYS[part]}=on does nothing here ({reason})")
        if reason is None and (helper := CompileAhead.start(part, cfg, run_dir, log)) is not None:
            helpers[part] = helper
    return helpers


class CompileAhead:
    """One helper process of a run: started at the end of the trainer's setup, waited for before the compile it
    stands in for."""

    def __init__(self, part: str, process: subprocess.Popen, config_file: Path, log_file: Path):
        self.part, self.process, self.config_file, self.log_file = part, process, config_file, log_file
        self.started = time.perf_counter()

    @classmethod
    def start(cls, part: str, cfg, run_dir: Path, log) -> CompileAhead | None:
        """Start `part`'s helper on `cfg` (the run's resolved config); it inherits this process's environment, so
        the compile cache's folders (CompileCache.activate) and the visible devices are the run's. None, with a
        line to `log`, where it cannot start: the run then compiles that part itself."""
        from ..config.files import save_toml

        config_file = None
        try:
            fd, name = tempfile.mkstemp(prefix=f"speedgpt-{part}-ahead-", suffix=".toml")
            os.close(fd)
            config_file = Path(name)
            save_toml(cfg, config_file)
            log_file = run_dir / log_name(part)
            with open(log_file, "w") as out:
                # a session of its own: a Ctrl-C at the terminal is the trainer's to handle (train/preempt.py); the
                # helper sets up its own signals (compile_helper.py), so no preexec_fn (unsafe beside threads)
                process = subprocess.Popen([sys.executable, "-m", "speedgpt.train.compile_helper", part,
                                            str(config_file), str(os.getpid())], stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        except (OSError, ValueError) as e:
            if config_file is not None:
                config_file.unlink(missing_ok=True)
            log(f"compile: the {part} helper did not start ({type(e).__name__}: {e}): {INSTEAD[part]}")
            return None
        return cls(part, process, config_file, log_file)

    def wait(self, stopping=lambda: False, timeout_s: float = WAIT_LIMIT_S) -> str:
        """Wait for the helper, at most `timeout_s` and only while `stopping()` is false (a stop signal to the
        trainer); a line for the log. A helper that is not done then is stopped: the trainer compiles its part."""
        t0 = time.perf_counter()
        try:
            while self.process.poll() is None:
                if stopping() or time.perf_counter() - t0 > timeout_s:
                    why = "the run is stopping" if stopping() else f"not done after {timeout_s:.0f}s of waiting"
                    self.stop()
                    return f"compile: the {self.part} helper was stopped ({why}): {INSTEAD[self.part]}"
                time.sleep(0.1)
        finally:
            self.config_file.unlink(missing_ok=True)
        waited, took = time.perf_counter() - t0, time.perf_counter() - self.started
        if self.process.returncode == 0:
            return (f"compile: {WHAT[self.part]} compiled ahead by a helper process (done {took:.1f}s after it "
                    f"started; waited {waited:.1f}s for it)")
        return (f"compile: the {self.part} helper failed (exit {self.process.returncode}; {self.log_file}): "
                f"{INSTEAD[self.part]}")

    def stop(self) -> None:
        """End the helper if it still runs (a run whose warmup ends before it is waited for): SIGTERM, then SIGKILL
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
    if os.getppid() != trainer_pid:  # the trainer died before the request above
        sys.exit(1)
