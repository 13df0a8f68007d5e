"""How a run's model is compiled (train.compile, train.compile_scope, train.compile_backend): the compile
cache opened, this run's Inductor settings, then the whole model under one torch.compile, or each
transformer block on its own."""

from __future__ import annotations

import torch

from ..config import Config
from ..model.gpt import GPT


def compile_blocks(model: GPT, **compile_kwargs) -> None:
    """torch.compile each transformer block in place: each block's backward is then its own autograd
    node, so gradient hooks (and the reductions they start) fire block by block during the backward."""
    for block in model.blocks:
        block.compile(dynamic=False, **compile_kwargs)


def open_compile_cache(cfg: Config, dist, log):
    """train.compile_cache for this run (compile_cache.py), its folders in place and its artifacts loaded;
    None when nothing is compiled to code (train.compile off, or a backend without caches) or it is off."""
    if not cfg.train.compile or cfg.train.compile_backend != "inductor":
        return None
    from .compile_cache import CompileCache

    cache = CompileCache.for_run(cfg.train.compile_cache, cfg.to_dict(), dist.world_size, dist.device)
    if cache is not None:
        log(cache.activate())
        log(cache.load())
    return cache


def compiled_forward(cfg: Config, model: GPT, strategy: str, log):
    """The model under torch.compile (with this run's Inductor settings), or the model itself."""
    if cfg.train.compile:
        import torch._inductor.config as inductor_config

        inductor_config.coordinate_descent_tuning = cfg.train.coordinate_descent_tuning
        from .inductor_tuning import persistent_reductions_upto

        note = persistent_reductions_upto(cfg.train.persistent_reductions_upto)
        if note:
            log(note)
        if cfg.train.compile_precompile:
            if strategy == "fsdp":  # blocks compiled one by one there: not tried
                log("compile: train.compile_precompile is off under fsdp (its blocks compile one by one)")
            else:
                # Set before torch.compile: each compile call then loads a matching package from the cache's
                # folder (put there by load_cache_artifacts) instead of tracing, and save_cache_artifacts
                # writes this run's. Process-wide, as torch.compile's other settings of a run are.
                torch._dynamo.config.caching_precompile = True
    if not cfg.train.compile or strategy == "fsdp":  # fsdp: compiled block by block (build_fsdp_model)
        return model
    backend = cfg.train.compile_backend
    if cfg.train.compile_scope == "block":  # reductions then start inside the backward
        compile_blocks(model, backend=backend)
        return model
    return torch.compile(model, dynamic=False, backend=backend)
