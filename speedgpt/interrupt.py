"""Ctrl-C while torch loads: held, then acted on.

torch's C extension imports numpy while it initializes and, when that import fails, clears the
error and carries on without numpy. A Ctrl-C that lands there is swallowed: numpy is left half
imported and the command either trains on as if nothing happened (exit 0) or fails later with a
misleading error ("module 'numpy' has no attribute 'matrix'", seen on a 2-core box about half a
second into `speedgpt train`). Holding SIGINT over that import and raising KeyboardInterrupt after
it gives the usual "interrupted" line and exit status 130 instead.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable


def _import_numpy_and_torch() -> None:
    import numpy  # noqa: F401  (whole before torch looks for it)
    import torch  # noqa: F401


def holding_ctrl_c(fn: Callable[[], None] | None = None) -> None:
    """Run fn (default: import numpy and torch) with SIGINT recorded rather than raised; raise
    KeyboardInterrupt after it if one came."""
    fn = fn or _import_numpy_and_torch
    if threading.current_thread() is not threading.main_thread():
        fn()  # only the main thread may set handlers (and only it receives KeyboardInterrupt)
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        fn()
    finally:
        signal.signal(signal.SIGINT, previous)
    if received and previous is not signal.SIG_IGN:
        raise KeyboardInterrupt
