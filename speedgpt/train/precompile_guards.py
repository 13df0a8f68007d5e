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
guards that need no context unpickle the same inside one.

Also here, applied with precompile on: torch 2.11's pickling of guard sources with derived fields, which kept any
package guarding a function's default from installing. mend_source_pickling replaces `__reduce__` and `__init__`
of the source classes that need it (DefaultsSource on 2.11; none on 2.13)."""

from __future__ import annotations

import contextlib
import dataclasses
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


def mend_source_pickling() -> list[str]:
    """Make dynamo's guard sources pickle as their constructors take them; the names of the classes mended.

    Why: torch 2.11 pickles a guard source (a frozen dataclass) as its class and *all* its fields, and a source with
    derived fields (`init=False`: DefaultsSource's `field` and `_name`, made by its __post_init__) then cannot be
    unpickled: "DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were given". A package whose
    guards hold a function's keyword-only default (dynamo guards those always) killed a fresh start that way (wave 17
    on an H200). torch 2.13 pickles the constructor's fields only; here the same is done on a torch that does not,
    and the constructor also takes the derived values a package saved before this mend carries, dropping them
    (__post_init__ makes them again), so such a package installs instead of killing the run again."""
    try:
        import torch._dynamo.source  # noqa: F401: defines DefaultsSource and its kin, found below as subclasses
        from torch._guards import Source
    except ImportError:
        return []
    mended = []
    todo = [Source]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if not dataclasses.is_dataclass(cls):
            continue
        fields = dataclasses.fields(cls)
        n_init = sum(f.init for f in fields)
        if n_init == len(fields) or not _pickles_derived_fields(cls, fields, n_init):
            continue
        _take_init_fields_only(cls, n_init, len(fields) - n_init)
        mended.append(cls.__name__)
    return mended


def _pickles_derived_fields(cls, fields, n_init: int) -> bool:
    """Whether this torch's __reduce__ for `cls` passes fields its constructor does not take (read from the code
    torch gives every Source: its reduce lists the fields it passes, so one is asked on a stand-in)."""
    try:
        stand_in = object.__new__(cls)
        for f in fields:
            object.__setattr__(stand_in, f.name, None)
        make, args = cls.__reduce__(stand_in)[:2]
    except Exception:  # noqa: BLE001: a class or reduce of another shape is torch's own business
        return False
    return make is cls and len(args) > n_init


def _take_init_fields_only(cls, n_init: int, n_derived: int) -> None:
    """`cls` pickles its constructor's fields (as torch 2.13 does), and its constructor ignores the derived fields
    an old pickle adds."""
    construct = cls.__init__

    @functools.wraps(cls.__reduce__)
    def __reduce__(self):
        return (self.__class__, tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.init))

    @functools.wraps(construct)
    def __init__(self, *args, **kwargs):
        if len(args) == n_init + n_derived and not kwargs:  # a pickle made by torch's own reduce
            args = args[:n_init]
        construct(self, *args, **kwargs)

    # torch's own two stay reachable as __wrapped__ (tests put them back); a mended class pickles right, so a second
    # call passes it by
    cls.__reduce__ = __reduce__
    cls.__init__ = __init__


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
