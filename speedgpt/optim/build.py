"""Assemble the optimizers for a model: Muon for hidden matrices, Adam for everything else.

One process: torch's AdamW (fused on CUDA) and Muon, exactly the single-GPU math. Several
(torch.distributed initialized with world size > 1): DistAdam and DistMuon, which shard the
optimizer work and state across ranks and reduce gradients through one shared GradSync
(parallel/ddp.py), attached to each optimizer as `opt.grad_sync`. Both write the same full,
unsharded state_dict format, so checkpoints move freely between world sizes.
"""

from __future__ import annotations

import torch

from ..config import OptimConfig
from ..parallel.dist import get_rank, get_world_size
from .muon import Muon

# torch AdamW's implementation flags: chosen for this process, never taken from a checkpoint.
_IMPL_FLAGS = ("fused", "foreach", "capturable", "differentiable")


def _keep_impl_flags(adam: torch.optim.AdamW) -> None:
    """A checkpoint written by DistAdam (or on another device) must not switch the fused kernel off:
    load_state_dict replaces group settings with the saved ones, so restore the flags afterwards."""
    flags = [{k: g.get(k) for k in _IMPL_FLAGS} for g in adam.param_groups]

    def restore(opt, *_):
        for group, f in zip(opt.param_groups, flags):
            group.update(f)
            for p in group["params"]:
                st = opt.state.get(p)
                if st and "step" in st:
                    # fused/capturable want the step count on the device; the others on the host.
                    on_device = bool(f["fused"] or f["capturable"])
                    st["step"] = st["step"].to(device=p.device if on_device else "cpu", dtype=torch.float32)

    adam.register_load_state_dict_post_hook(restore)


def build_optimizers(model, cfg: OptimConfig, device: torch.device,
                     world_size: int | None = None) -> list[torch.optim.Optimizer]:
    """[adam, muon]. world_size None: torch.distributed's (1 without a process group); 1 forces the
    single-process optimizers (a reference inside a distributed test)."""
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
        _keep_impl_flags(adam)
        muon = Muon(matrices, **muon_kwargs)
    else:
        from ..optim.adam import DistAdam
        from ..optim.muon import DistMuon
        from ..parallel.ddp import GradSync

        sync = GradSync(world, get_rank(), device)
        adam = DistAdam(adam_groups, sync, betas=betas, eps=cfg.adam_eps, weight_decay=cfg.adam_weight_decay)
        muon = DistMuon(matrices, sync, **muon_kwargs)
    optimizers = [adam, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers
