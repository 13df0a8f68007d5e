"""Dynamo's saved guards restored inside a tracing context, so that a flex-attention model's package installs
on a fresh start (train.compile_precompile).

Why: torch (2.11 and 2.13 alike) unpickles a saved package's guards outside any trace, and flex attention's
guards ask for the tracing context while they are rebuilt ("TracingContext.get() must be called within an
ongoing trace"). Dynamo then starts the package again and the run dies with "CompilePackage is already
initialized" (benchmarks/precompile_probe.py, case flex). Unpickling them inside a context made for the purpose,
with guard installation skipped, is the remedy proposed upstream (pytorch/pytorch#187736): the guards come back
as saved, and none leaks into a later trace.

This patches one function of torch's (torch._dynamo.package.load_guards_state), once a process, and only where
that function exists; a torch without it keeps its own behaviour and the caller is told so. Applied whenever
precompile is on: the cause (guard sources that install themselves while unpickled) is not flex's alone, and
guards that need no context unpickle the same inside one."""

from __future__ import annotations

import contextlib
import functools
import logging

PATCHED = "_speedgpt_guards_in_a_trace"  # marks torch's function once wrapped, so a second call changes nothing


def restore_guards_in_a_trace() -> bool:
    """Wrap torch's guard unpickling in a throwaway tracing context; True where that is now in place."""
    try:
        from torch._dynamo import package
        from torch._guards import TracingContext, tracing
    except ImportError:
        return False
    load = getattr(package, "load_guards_state", None)
    if load is None:
        return False
    if getattr(load, PATCHED, False):
        return True

    @functools.wraps(load)  # torch's own stays reachable as __wrapped__ (tests put it back)
    def load_guards_state(state):
        ctx = TracingContext(None)
        # guards rebuilt here belong to the saved entry, not to this throwaway context
        skip = getattr(ctx.guards_context, "skip_guard_install", contextlib.nullcontext)
        with tracing(ctx), skip():
            return load(state)

    setattr(load_guards_state, PATCHED, True)
    package.load_guards_state = load_guards_state
    return True


DROPPED_GUARD = "is dropped with caching_precompile"  # torch's warning, one per identity guard a package drops


class DroppedGuardWarnings(logging.Filter):
    """Holds back torch's per-guard warning about the identity guards (on modules, builtins, closures) that caching
    precompile drops out of a package: 46 an entry for a one-layer CPU model, ~1,780 a GPU run (wave 6). The
    dropping is by design (a new process has new objects; a changed model file is caught by the package's source
    hashes instead), so the run says it once (silence_dropped_guard_warnings' caller) instead of a line each."""

    def filter(self, record: logging.LogRecord) -> bool:
        return DROPPED_GUARD not in str(record.msg)


def silence_dropped_guard_warnings() -> None:
    """DroppedGuardWarnings on torch's guards logger, once a process."""
    logger = logging.getLogger("torch._dynamo.guards")
    if not any(isinstance(f, DroppedGuardWarnings) for f in logger.filters):
        logger.addFilter(DroppedGuardWarnings())
