"""How a run's model is compiled (train.compile, train.compile_scope): this run's Inductor settings,
then the whole model under one torch.compile, or each transformer block on its own."""

from __future__ import annotations

import torch

from ..config import Config
from ..model.gpt import GPT


def compile_blocks(model: GPT, **compile_kwargs) -> None:
    """torch.compile each transformer block in place: each block's backward is then its own autograd
    node, so gradient hooks (and the reductions they start) fire block by block during the backward."""
    for block in model.blocks:
        block.compile(dynamic=False, **compile_kwargs)


def compiled_forward(cfg: Config, model: GPT, strategy: str, log):
    """The model under torch.compile (with this run's Inductor settings), or the model itself."""
    if cfg.train.compile:
        import torch._inductor.config as inductor_config

        inductor_config.coordinate_descent_tuning = cfg.train.coordinate_descent_tuning
        from .inductor_tuning import persistent_reductions_upto

        note = persistent_reductions_upto(cfg.train.persistent_reductions_upto)
        if note:
            log(note)
    if not cfg.train.compile or strategy == "fsdp":  # fsdp: compiled block by block (build_fsdp_model)
        return model
    if cfg.train.compile_scope == "block":  # reductions then start inside the backward
        compile_blocks(model)
        return model
    return torch.compile(model, dynamic=False)
