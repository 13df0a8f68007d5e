"""Building a model: `model_from_config(cfg, device)` for a run's config (training, eval, sampling,
export and bench all use it), `build_model` when only a model config and a runtime are at hand."""

from __future__ import annotations

import torch

from ..config import Config, ModelConfig
from .gpt import GPT
from .runtime import ModelRuntime, max_seq_len, resolve_runtime, runtime_for


def build_model(cfg: ModelConfig, max_seq_len: int, runtime: ModelRuntime | str | torch.device = "cpu", *,
                seed: int = 0) -> GPT:
    """Build on the meta device, allocate on the runtime's device, then initialize there (seeded).
    A device instead of a runtime means that device's defaults (`runtime_for`)."""
    if not isinstance(runtime, ModelRuntime):
        runtime = runtime_for(cfg, runtime)
    device = runtime.device
    with torch.device("meta"):
        model = GPT(cfg, max_seq_len, runtime)
    model.to_empty(device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model.init_weights()
    if cfg.bf16_embeds:
        for emb in model.embeddings():
            emb.to(torch.bfloat16)
    return model


def model_from_config(cfg: Config, device: str | torch.device, *, world_size: int = 1,
                      dtype: torch.dtype | None = None, step: int | None = None) -> GPT:
    """The model a run's config describes, on `device`, initialized from the run's seed. `dtype`
    overrides the config's compute dtype (evaluating a bf16 run in fp32, say); `step`: forward's
    default windows are those of that training step (default: the last)."""
    runtime = resolve_runtime(cfg, device, world_size=world_size, step=step)
    if dtype is not None:
        runtime = runtime.replace(dtype=dtype)
    return build_model(cfg.model, max_seq_len(cfg), runtime, seed=cfg.train.seed)
