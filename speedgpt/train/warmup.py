"""The compile warmup's plan: which steps it trains so that the timed run meets no new graph, and
the snapshot that puts the model, optimizers and data position back as they were before it (the
measured run starts cold in its numbers but warm in its kernels)."""

from __future__ import annotations

import copy
from contextlib import contextmanager

from ..config import Config
from ..stages import StagePlan


def warmup_steps(cfg: Config, plan: StagePlan) -> list[int]:
    """The steps the warmup trains: train.warmup_steps spread over the run, plus the first step of every later
    stage (its batch, row length and MTP weight count may be new shapes), in order. One spread step (step 0) is
    enough where nothing else about a step changes its graphs: windows, YaRN state, MTP weights and
    model.tie_embed_frac's untie are data (step_schedule.py, model/embeddings.py EmbedTying; the untie's own work is
    eager), so the speedrun presets take 1 (each further step costs a step's time at every start: by wave 15's step
    times, speedrun-latest's nine more came to ~4 s). More serve a model whose graphs change with the step; a graph the
    warmup missed is logged at the run's end (compile_watch.AFTER_WARMUP)."""
    from .compile import uses_cudagraphs

    n, total = cfg.train.warmup_steps, cfg.train.steps
    spread = [min(total - 1, (i * total) // n) for i in range(n)]
    extra = {stage.start for stage in plan.stages} if plan.from_table else set()
    if uses_cudagraphs(cfg):  # torch's CUDA graphs run a graph's first call and record it on a later one: record
        firsts = extra or {0}  # them in the warmup (a rank with one micro-step a step calls each graph once a step)
        extra = firsts | {min(s + 1, total - 1) for s in firsts}
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
