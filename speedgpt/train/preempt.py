"""Graceful stop on SIGTERM / SIGINT: finish the step, write a checkpoint, exit non-zero.

Schedulers (Slurm, Kubernetes, torchrun's agent) announce preemption with SIGTERM, a person with
Ctrl-C (SIGINT). The first signal only sets a flag; the trainer reads it at the next step
boundary (on several ranks the flags are combined, so every rank stops at the same step), saves
and raises `TrainingStopped`. A second signal means "now": the process exits at once with
128 + signal number; the newest complete checkpoint stays the one `--resume` picks (a checkpoint
being written is only a temporary directory until its final rename).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TrainingStopped(Exception):
    """Training stopped on a signal after writing a checkpoint; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None, run_dir: Path, signal_step: int = -1):
        self.signum, self.step, self.checkpoint, self.run_dir = signum, step, checkpoint, run_dir
        self.signal_step = signal_step
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        where = f"checkpoint {checkpoint} written" if checkpoint else "no checkpoint could be written"
        # Steps completed between the signal and the checkpoint: 1 when it arrived mid-step, 0 between steps.
        self.steps_after_signal = step - signal_step if signal_step >= 0 else None
        arrived = f" ({self.steps_after_signal} step(s) after the signal)" if signal_step >= 0 else ""
        super().__init__(f"stopped by {name} at step {step}{arrived}; {where}; resume with: "
                         f"speedgpt train --resume {run_dir}")


class StoppedMidStep(TrainingStopped):
    """A stop signal came, and the step or start under way then failed instead of finishing. The usual cause is
    the signal itself: Slurm, Kubernetes and `timeout` signal the whole process group, so torch.compile's
    compiler workers die with it and the compile raises (seen on the CPU: Inductor's `CppCompileError` during a
    start). Nothing is saved after such a failure; the newest checkpoint, if any, is the one `--resume` picks."""

    def __init__(self, signum: int, step: int, run_dir: Path, cause: BaseException, has_checkpoint: bool):
        super().__init__(signum, step, None, run_dir)
        name = signal.Signals(signum).name
        first = next((line for line in str(cause).splitlines() if line.strip()), "")
        failed = f"{type(cause).__name__}{': ' + first[:160] if first else ''}"
        after = (f"resume with: speedgpt train --resume {run_dir}" if has_checkpoint
                 else "nothing was saved: run the same command again")
        self.args = (f"stopped by {name} before step {step + 1} finished (then it failed with {failed}, "
                     f"likely as the signal also reached its worker processes); {after}",)


class StopRequest:
    """Installs the stop handlers for the duration of a `with` block (main thread only: Python
    delivers signals there; elsewhere, e.g. a test's worker thread, it does nothing)."""

    def __init__(self, announce: bool = True):
        self.signum = 0
        self.step = 0  # steps completed, kept current by the trainer (a host int: no sync)
        self.signal_step = -1  # steps completed when the first signal arrived
        self.announce = announce
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            print(f"{name} again: exiting now; the newest complete checkpoint is kept", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum = signum
        self.signal_step = self.step
        if self.announce:
            print(f"{name} received: finishing this step, then writing a checkpoint (send it again to exit at once)",
                  file=sys.stderr, flush=True)
