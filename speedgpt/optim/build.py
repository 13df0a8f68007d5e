"""Assemble the optimizers for a model: Muon for hidden matrices, Adam for everything else."""

from __future__ import annotations

import torch

from ..config import OptimConfig
from .muon import Muon


def build_optimizers(model, cfg: OptimConfig, device: torch.device) -> list[torch.optim.Optimizer]:
    groups = model.param_groups()
    # Adam lrs were tuned at width 768; wider models take proportionally smaller steps.
    scale = (768 / model.cfg.resolved_dim()) ** 0.5 if cfg.scale_lr_by_width else 1.0
    adam_groups = [
        dict(params=groups[name], lr=lr * scale, name=name)
        for name, lr in (("embed", cfg.embed_lr), ("value_embed", cfg.value_embed_lr),
                         ("head", cfg.head_lr), ("scalar", cfg.scalar_lr))
        if groups[name]
    ]
    adam = torch.optim.AdamW(adam_groups, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                             weight_decay=cfg.adam_weight_decay, fused=device.type == "cuda")
    muon = Muon(groups["matrix"], lr=cfg.muon_lr, momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov,
                ns_steps=cfg.muon_ns_steps, weight_decay=cfg.muon_weight_decay)
    optimizers = [adam, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers
