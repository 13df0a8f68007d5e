"""How a run's model is compiled (train.compile, train.compile_scope, train.compile_backend): the compile
cache opened, this run's Inductor settings, then the whole model under one torch.compile, or each
transformer block on its own."""

from __future__ import annotations

import inspect
import time

import torch

from ..config import Config
from ..config.sections import CUDAGRAPH_MODES
from ..model.gpt import GPT
from .precompile_guards import mend_source_pickling, restore_guards_in_a_trace, silence_dropped_guard_warnings


# The oldest torch whose fresh start from a precompile package was seen to work on a CPU: 2.13 (tests and
# benchmarks/dynamo_precompile.py), and 2.11 since its guard sources' pickling is mended (precompile_guards.py:
# wave 17's fresh start on an H200 died of it); 2.11 with the FP8 paths and flex's GPU kernels is owed to a GPU
# (wave18.sh).
PRECOMPILE_TORCH = (2, 11)


def torch_older_than(version: tuple[int, int]) -> bool:
    """Whether this torch's (major, minor) is below `version` (a dev or local build counts as its release)."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) < version


def compile_blocks(model: GPT, **compile_kwargs) -> None:
    """torch.compile each transformer block in place: each block's backward is then its own autograd
    node, so gradient hooks (and the reductions they start) fire block by block during the backward.

    All blocks run one code object (Block.forward) and dynamo keeps compiled entries per code object, so
    blocks that differ in structure (window key, value embedding or not, attention-free, paired heads, key
    offset) are recompiles of one frame: speedrun-124m's 12 blocks with validation, or speedrun-latest's
    first stage, passed the default torch._dynamo.config.recompile_limit (8) and dynamo ran the remaining
    blocks eagerly (issue 33). So this compile gets a limit of its own, the global one per block: each block
    may recompile as often as a function of its own could, and no other compiled code's limit changes.
    Not the alternatives: making those attributes data instead of guards would run every branch in every
    block (slower steps); isolated recompiles (one cache per block) would compile identical blocks again.
    torch._dynamo.config.accumulated_recompile_limit (256 entries) stays: a real model has a few variants
    times a few shapes (tens), far below it."""
    limit = len(model.blocks) * torch._dynamo.config.recompile_limit
    for block in model.blocks:
        compile_with_limit(block, limit, dynamic=False, **compile_kwargs)


def compile_takes_recompile_limit() -> bool:
    """Whether this torch's torch.compile has a recompile limit of its own per call."""
    return "recompile_limit" in inspect.signature(torch.compile).parameters


def compile_with_limit(module: torch.nn.Module, recompile_limit: int, **compile_kwargs) -> None:
    """module.compile(...) whose frames may recompile `recompile_limit` times: torch.compile's own argument
    where this torch has it, else the same limit patched around each call of the compiled module."""
    if compile_takes_recompile_limit():
        module.compile(recompile_limit=recompile_limit, **compile_kwargs)
        return
    module.compile(**compile_kwargs)
    # nn.Module.compile keeps the compiled callable here; dynamo reads its config when a frame converts
    patch = torch._dynamo.config.patch(recompile_limit=recompile_limit)
    module._compiled_call_impl = patch(module._compiled_call_impl)


def compile_mode_arg(cfg: Config) -> str | None:
    """train.compile_mode as torch.compile's `mode` argument: None for torch's default."""
    return None if cfg.train.compile_mode == "default" else cfg.train.compile_mode


def uses_cudagraphs(cfg: Config) -> bool:
    """Whether this run's compiled code replays as CUDA graphs (torch's cudagraph trees): each call of the
    compiled forward then marks a new step first (marking_steps)."""
    return cfg.train.compile and cfg.train.compile_mode in CUDAGRAPH_MODES


def mark_cudagraph_step() -> None:
    """Tells torch's cudagraph trees that a new micro-step begins, so the next replay may overwrite the previous
    one's graph outputs (torch's static buffers)."""
    torch.compiler.cudagraph_mark_step_begin()


def marking_steps(forward):
    """`forward` that marks a new cudagraph step before each call: every call is a training micro-step or a
    validation batch, and each caller reads its loss (a micro-step's divided and accumulated, a batch's weighted)
    before the next call, so the next replay may overwrite it."""
    def call(*args, **kwargs):
        mark_cudagraph_step()
        return forward(*args, **kwargs)
    return call


def grads_out_of_cudagraph_pool(model: torch.nn.Module) -> None:
    """Each parameter's gradient replaced by an eager copy, after a step's first backward under CUDA graphs.
    That backward's gradients are the replayed graph's outputs, in torch's static buffers, which the next micro-step's
    replay overwrites: accumulating into them there failed (wave 15: "accessing tensor output of CUDAGraphs that has
    been overwritten by a subsequent run", the embedding's gradient), and a sum kept past the step (DistAdam's
    unreduced gradients, optim.adam_every) would read it after the next step's replay. Later micro-steps add into
    the copies in place. Collectives the first backward launched packed their buffers before the copies (stream
    order). One copy of the gradients a step (a foreach kernel; speedrun-latest's are ~2 GiB), inside the +0.7 % that
    wave 15 measured for CUDA graphs."""
    params = [p for p in model.parameters() if p.grad is not None]
    for p, g in zip(params, torch._foreach_mul([p.grad for p in params], 1.0)):
        p.grad = g


def open_compile_cache(cfg: Config, dist, log):
    """train.compile_cache for this run (compile_cache.py), its folders in place and its artifacts loaded;
    None when nothing is compiled to code (train.compile off, or a backend without caches) or it is off."""
    if not cfg.train.compile or cfg.train.compile_backend != "inductor":
        return None
    from .compile_cache import CompileCache

    # (where precompile cannot apply, compile_scope=block say, the run shares Inductor's common folder)
    precompile = cfg.train.compile_precompile and precompile_blocked_by_config(cfg.train) is None
    cache = CompileCache.for_run(cfg.train.compile_cache, cfg.to_dict(), dist.world_size, dist.device, dist.rank,
                                 precompile=precompile)
    if cache is not None:
        log(cache.activate())
        log(cache.load())
        if cfg.train.warmup_steps <= 0:  # the artifacts are saved after the warmup (Trainer.warmup_then_reset)
            log("compile cache: train.warmup_steps=0, so this run saves nothing to it (artifacts are saved after "
                "the warmup); give --train.warmup_steps=N (e.g. 1) to fill it")
    return cache


def precompile_blocked_by_config(t) -> str | None:
    """Why train.compile_precompile cannot apply to a run of this train config, as its start log says it; None
    where it can (compiled_forward then checks the strategy, the torch and the model)."""
    if not t.compile:
        return "has nothing to keep: train.compile is off"
    if t.compile_backend != "inductor" or t.compile_cache == "off":
        # (the package travels in the compile cache's artifact file, which only Inductor's runs write)
        return ("is off: it keeps dynamo's traced code in train.compile_cache, which "
                + ("is off" if t.compile_cache == "off" else "only the inductor backend uses"))
    if t.compile_scope == "block":
        return "is off with compile_scope=block (its blocks compile one by one)"
    return None


def compiled_forward(cfg: Config, model: GPT, strategy: str, log, cache=None):
    """The model under torch.compile (with this run's Inductor settings), or the model itself; with `cache` (the
    run's CompileCache) its compiles may keep the FP8 paths' graphs in AOTAutograd's cache (compile_cache.py)."""
    blocked = precompile_blocked_by_config(cfg.train) if cfg.train.compile_precompile else None
    if blocked:  # (speedrun-latest's preset sets it: said once, not refused)
        log(f"compile: train.compile_precompile {blocked}")
    if cfg.train.compile:
        from .inductor_tuning import apply_inductor_settings

        note = apply_inductor_settings(cfg.train)
        if note:
            log(note)
        precompile = cfg.train.compile_precompile and not blocked
        if precompile and strategy == "fsdp":  # blocks compiled one by one there
            precompile = False
            log("compile: train.compile_precompile is off under fsdp (its blocks compile one by one)")
        elif precompile and torch_older_than(PRECOMPILE_TORCH):  # never tried there: trace instead
            precompile = False
            log(f"compile: train.compile_precompile is off on torch {torch.__version__} (needs "
                f"{'.'.join(map(str, PRECOMPILE_TORCH))} or later)")
        elif precompile and not restore_guards_in_a_trace() and model.runtime.attn_backend == "flex":
            # A fresh start would die inside torch: flex's saved guards cannot be rebuilt outside a trace
            # ("CompilePackage is already initialized"), and this torch lacks the function that
            # precompile_guards.py wraps to fix that.
            precompile = False
            log("compile: train.compile_precompile is off with flex attention (this torch cannot restore "
                "flex's saved guards on a fresh start: benchmarks/precompile_probe.py)")
        # Set before torch.compile, on or off for every compiled run: with it on, each compile call loads a matching
        # package from the cache's folder (put there by load_cache_artifacts) instead of tracing, and
        # save_cache_artifacts writes this run's. Process-wide, as torch.compile's other settings of a run are, so
        # set off too: a second config in one process (bench --ab) must not inherit the first's.
        torch._dynamo.config.caching_precompile = precompile
        if precompile:
            mended = mend_source_pickling()
            if mended:
                log(f"compile: precompile: this torch's pickling of {', '.join(mended)} mended (a fresh start "
                    "could not restore such guards: precompile_guards.py)")
            silence_dropped_guard_warnings()
            log("compile: precompile on: dynamo's traced code is kept in the compile cache; torch drops its "
                "identity guards on modules and builtins from it (their warnings not shown: a changed model "
                "file is caught by the saved source hashes instead)")
    if not cfg.train.compile:
        return model
    from torch._dynamo.utils import counters

    t0, hits = time.perf_counter(), counters["dynamo_cache"]["dynamo_cache_hit"]
    backend, mode = cfg.train.compile_backend, compile_mode_arg(cfg)
    if mode is not None:
        log(f"compile: mode {mode}" + (" (CUDA graphs: each compiled forward and backward replays as one launch)"
                                       if uses_cudagraphs(cfg) else ""))
    if cfg.train.compile_scope == "block" or strategy == "fsdp":  # reductions then start inside the backward
        compile_blocks(model, backend=backend, mode=mode)
        forward = model
    else:
        forward = torch.compile(model, dynamic=False, backend=backend, mode=mode)
    # With caching precompile a package found in the cache is installed inside torch.compile's call, before the
    # warmup: its backends loaded, on a CPU their C++ built (benchmarks/dynamo_precompile.py: 26-28 s of a fresh CPU
    # start). The trainer counts this call in "compile + warmup" (with train.warmup_steps=0 this line alone says
    # it). Torch times the install as a frame's compile with no backend call, which compile_breakdown would split as
    # trace and a negative aot. The hit counter rose in this call: this run's install, not an earlier one's.
    if torch._dynamo.config.caching_precompile and counters["dynamo_cache"]["dynamo_cache_hit"] > hits:
        log(f"compile: dynamo's saved package installed in {time.perf_counter() - t0:.1f}s (backends loaded, "
            "kernels built; nothing traced; part of compile + warmup when the run warms up)")
    forward = forward if cache is None else cache.with_custom_functions(forward)
    return marking_steps(forward) if uses_cudagraphs(cfg) else forward
