"""The compile warmup's plan: which steps it trains so that the timed run meets no new graph, and
the snapshot that puts the model, optimizers and data position back as they were before it (the
measured run starts cold in its numbers but warm in its kernels)."""

from __future__ import annotations

import copy
from contextlib import contextmanager

from ..config import Config
from ..stages import StagePlan


def warmup_steps(cfg: Config, plan: StagePlan) -> list[int]:
    """The steps the warmup trains: train.warmup_steps spread over the run, so every window size the
    run will use gets compiled, plus the first step of every later stage (its batch, row length and
    MTP weight count are new shapes), in order. model.tie_embed_frac's untie step needs none: both
    phases run one graph (model/embeddings.py EmbedTying), and the untie's own work is eager."""
    n, total = cfg.train.warmup_steps, cfg.train.steps
    spread = [min(total - 1, (i * total) // n) for i in range(n)]
    extra = {stage.start for stage in plan.stages} if plan.from_table else set()
    if not extra:
        return spread
    return sorted(set(spread) | extra)


@contextmanager
def restored_afterwards(model, optimizers, loader):
    """Run the block, then restore the model's and optimizers' state and the loader's position exactly
    as they were before it (not after an error: a failed warmup ends the run)."""
    model_state = copy.deepcopy(model.state_dict())
    optim_states = copy.deepcopy(optimizers.state_dict())
    loader_state = loader.state_dict()
    yield
    model.load_state_dict(model_state)
    optimizers.load_state_dict(optim_states)
    loader.load_state_dict(loader_state)
