"""Assemble the optimizers for a model: Muon for hidden matrices, Adam for everything else.

One process: torch's AdamW (fused on CUDA) and Muon, exactly the single-GPU math. Several
(torch.distributed initialized with world size > 1): DistAdam and DistMuon, which shard the
optimizer work and state across ranks and reduce gradients through one shared GradSync
(parallel/ddp.py), attached to each optimizer as `opt.grad_sync`. The container (optim/container.py)
names them and writes one full, unsharded checkpoint format for every world size.
"""

from __future__ import annotations

import torch

from ..config import OptimConfig
from ..parallel.ddp import NoSync
from ..parallel.dist import get_rank, get_world_size
from .container import Optimizers
from .muon import Muon


def build_optimizers(model, cfg: OptimConfig, device: torch.device,
                     world_size: int | None = None) -> Optimizers:
    """The container of `adam` and `muon`. world_size None: torch.distributed's (1 without a process
    group); 1 forces the single-process optimizers (a reference inside a distributed test)."""
    groups = model.param_groups()
    # Adam lrs were tuned at width 768; wider models take proportionally smaller steps.
    scale = (768 / model.cfg.resolved_dim()) ** 0.5 if cfg.scale_lr_by_width else 1.0
    adam_groups = [
        dict(params=groups[name], lr=lr * scale, name=name)
        for name, lr in (("embed", cfg.embed_lr), ("value_embed", cfg.value_embed_lr),
                         ("head", cfg.head_lr), ("scalar", cfg.scalar_lr))
        if groups[name]
    ]
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    world = get_world_size() if world_size is None else world_size
    muon_kwargs = dict(lr=cfg.muon_lr, momentum=cfg.muon_momentum, nesterov=cfg.muon_nesterov,
                       ns_steps=cfg.muon_ns_steps, weight_decay=cfg.muon_weight_decay, ortho=cfg.muon_ortho,
                       normuon=cfg.normuon, normuon_beta2=cfg.normuon_beta2, cautious_wd=cfg.cautious_wd,
                       ns_fused=cfg.muon_ns_fused)
    matrices = groups["matrix"]
    if cfg.muon_shape_factor == "record28":
        # Record #28's shape factor max(1, rows/cols)^0.5 is taken on its own storage layout, which for
        # the MLP input weight is the transpose of this model's: those matrices get a group of their own.
        flipped = {id(p) for p in model.record28_transposed()}
        matrices = [dict(params=[p for p in matrices if id(p) not in flipped]),
                    dict(params=[p for p in matrices if id(p) in flipped], shape_transposed=True)]
        matrices = [g for g in matrices if g["params"]]
    if world == 1:
        adam = torch.optim.AdamW(adam_groups, betas=betas, eps=cfg.adam_eps,
                                 weight_decay=cfg.adam_weight_decay, fused=device.type == "cuda")
        muon = Muon(matrices, **muon_kwargs)
        sync = NoSync()
    else:
        from ..optim.adam import DistAdam
        from ..optim.muon import DistMuon
        from ..parallel.ddp import GradSync

        sync = GradSync(world, get_rank(), device)
        adam = DistAdam(adam_groups, sync, betas=betas, eps=cfg.adam_eps, weight_decay=cfg.adam_weight_decay)
        muon = DistMuon(matrices, sync, **muon_kwargs)
    for opt in (adam, muon):
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return Optimizers(adam, muon, {id(p): name for name, p in model.named_parameters()}, sync)
