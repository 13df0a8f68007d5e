"""Host syncs of a piece of work (a training step), counted by torch's CUDA sync debug mode, and the
lines of code that made them.

A host sync per step keeps the host from running ahead of the GPU: every host-side gap of the step (the
optimizers' launches, an eagerly built mask) then becomes GPU idle time (issue 34). In "warn" mode torch
warns at each synchronizing operation it detects: a copy to or from pageable host memory (torch.tensor(v,
device=cuda), .cpu()), .item(), .tolist(), bool(tensor), nonzero, a stream's synchronize. Torch says itself
that the mode "does not yet detect all synchronizing operations": its check sits in a stream's synchronize and
the synchronizing copies, so torch.cuda.synchronize() (a device synchronize), Event.synchronize() and waits inside
NCCL are not reported. A sync in a backward is reported at the line that called .backward(): the autograd engine
replays its threads' warnings there.
"""

from __future__ import annotations

import functools
import re
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, NamedTuple

import torch

# torch's warning text (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync); Python sees it with
# " (Triggered internally at ...)" appended
SYNC_WARNING = "called a synchronizing CUDA operation"


@functools.cache
def _roots() -> tuple[Path, Path, Path, Path]:
    """(this file, the warnings module's, the speedgpt package: its frames are the ones worth naming, torch's)."""
    this = Path(__file__).resolve()
    return this, Path(warnings.__file__).resolve(), this.parent, Path(torch.__file__).resolve().parent


class HostSyncs(NamedTuple):
    count: int
    sites: dict[str, int]  # where each sync came from ("speedgpt/model/fp8_head.py:57") -> its syncs, first seen first

    def describe(self, limit: int = 4) -> str:
        """The first `limit` distinct sites with their counts, "a.py:1 x4, b.py:9 x1 (+2 more sites)"."""
        shown = [f"{site} x{n}" for site, n in list(self.sites.items())[:limit]]
        more = len(self.sites) - limit
        return ", ".join(shown) + (f" (+{more} more site{'s' * (more > 1)})" if more > 0 else "")


@contextmanager
def cuda_sync_warnings():
    """torch.cuda.set_sync_debug_mode("warn") inside the block, the mode before it restored after."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def count_host_syncs(fn: Callable[[], object], debug_mode=cuda_sync_warnings) -> HostSyncs:
    """Run `fn()` under `debug_mode` (a context manager: torch's warn mode on a GPU; a test passes
    contextlib.nullcontext and a callable that warns as torch does) and count the sync warnings it raises,
    each attributed to a site. Every sync counts, also the second at a line (Python's default filter shows a
    warning once per line); other warnings go on to whatever showed them before, not swallowed."""
    count, sites = 0, {}
    with warnings.catch_warnings():  # filters and showwarning restored on exit
        warnings.filterwarnings("always", message=re.escape(SYNC_WARNING), category=UserWarning)
        shown_before = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            nonlocal count
            if not (issubclass(category, UserWarning) and str(message).startswith(SYNC_WARNING)):
                shown_before(message, category, filename, lineno, file, line)
                return
            count += 1
            where = sync_site(traceback.extract_stack(), filename, lineno)
            sites[where] = sites.get(where, 0) + 1

        if "torch._dynamo" in sys.modules:  # a compiled step: a sync in a frame dynamo runs must not trace the hook
            record = torch._dynamo.disable(record)
        warnings.showwarning = record
        with debug_mode():
            fn()
    return HostSyncs(count, sites)


def sync_site(stack: list[traceback.FrameSummary], filename: str, lineno: int) -> str:
    """Where a sync came from: the innermost frame of the stack outside torch (Inductor's generated code
    included) and the warning machinery, i.e. the code that asked torch for it, with the frame that called
    into torch's C++ beside it when that is another one: "speedgpt/train/loop.py:213 (in torch/_tensor.py:625)"."""
    this, machinery, _, torch_root = _roots()
    callers = [f for f in stack if Path(f.filename).resolve() not in (this, machinery)
               and not _under(f.filename, torch_root) and "torchinductor" not in f.filename]
    origin = f"{_short(filename)}:{lineno}"
    if not callers:
        return origin
    site = f"{_short(callers[-1].filename)}:{callers[-1].lineno}"
    return site if site == origin else f"{site} (in {origin})"


def _under(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root)


def _short(path: str) -> str:
    """A path as the report names it: from the speedgpt (or torch) package on, else as it is."""
    p = Path(path).resolve()
    for root in _roots()[2:]:
        if p.is_relative_to(root):
            return str(p.relative_to(root.parent))
    return path
