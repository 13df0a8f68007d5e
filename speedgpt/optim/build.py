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


def adam_groups(model, cfg: OptimConfig) -> list[dict]:
    """Adam's parameter groups: with optim.kind="muon" the embeddings, head, scalars, MoE routers and
    gates at their own lrs; with "adamw" every parameter at optim.adamw_lr, decayed (adamw_weight_decay)
    where it is a matrix (the hidden matrices and the head), not where it is an embedding, a scalar, a
    router or a gate."""
    groups = model.param_groups()
    if cfg.kind == "adamw":
        decay = groups["matrix"] + groups["head"]
        rest = [p for name, params in groups.items() if name not in ("matrix", "head") for p in params]
        return [dict(params=decay, lr=cfg.adamw_lr, weight_decay=cfg.adamw_weight_decay, name="matrix"),
                dict(params=rest, lr=cfg.adamw_lr, weight_decay=0.0, name="no_decay")]
    # Adam lrs were tuned at width 768; wider models take proportionally smaller steps.
    scale = (768 / model.cfg.resolved_dim()) ** 0.5 if cfg.scale_lr_by_width else 1.0
    return [
        dict(params=groups[name], lr=lr * scale, name=name, weight_decay=cfg.adam_weight_decay)
        for name, lr in (("embed", cfg.embed_lr), ("value_embed", cfg.value_embed_lr),
                         ("head", cfg.head_lr), ("scalar", cfg.scalar_lr), ("router", cfg.router_lr),
                         # the later records' parameters: groups only where their switch is on
                         ("bigram_embed", cfg.bigram_embed_lr), ("smear_gate", cfg.smear_gate_lr),
                         ("skip_gate", cfg.skip_gate_lr), ("value_embed_gate", cfg.value_embed_gate_lr))
        if groups[name]
    ]


def defer_adam_reduction(cfg: OptimConfig, world_size: int, strategy: str = "ddp",
                         grads_read_each_step: bool = False) -> bool:
    """Whether DistAdam leaves its gradients unreduced on the steps Adam does not update (optim.adam_every > 1;
    optim/adam.py): only under ddp on several ranks (one rank has nothing to reduce; fsdp reduces in its own
    backward), and only where nothing reads the reduced gradients every step: optim.grad_clip's global norm
    includes Adam's, and so does the numerics guard's check in skip mode (`grads_read_each_step`)."""
    return (cfg.adam_every > 1 and world_size > 1 and strategy == "ddp" and not cfg.grad_clip
            and not grads_read_each_step)


def build_optimizers(model, cfg: OptimConfig, device: torch.device,
                     world_size: int | None = None, *, strategy: str = "ddp",
                     grad_comm_dtype: torch.dtype | None = None, grads_read_each_step: bool = False) -> Optimizers:
    """The container of `adam` and `muon` (no `muon` with optim.kind="adamw"). world_size None:
    torch.distributed's (1 without a process group); 1 forces the single-process optimizers (a
    reference inside a distributed test). strategy "fsdp": the model's parameters are DTensor
    shards (parallel/fsdp.py), which torch's AdamW and ShardedMuon update in place. grad_comm_dtype
    (parallel.grad_comm_dtype, several ranks under ddp): the dtype GradSync reduce-scatters gradients
    in; None: the parameters' own (fsdp reads the key in its MixedPrecisionPolicy instead).
    grads_read_each_step: the caller reads the reduced gradients after every backward (the numerics guard
    in skip mode), so Adam's cannot wait unreduced (defer_adam_reduction)."""
    groups = model.param_groups()
    adam_params = adam_groups(model, cfg)
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
    use_muon = cfg.kind == "muon"
    muon = None
    if strategy == "fsdp":
        from ..parallel.fsdp import FSDPSync
        from .sharded_muon import ShardedMuon

        adam = torch.optim.AdamW(adam_params, betas=betas, eps=cfg.adam_eps, foreach=True)
        if use_muon:
            muon = ShardedMuon(matrices, **muon_kwargs)
        sync = FSDPSync(model, world, device)
    elif world == 1:
        adam = torch.optim.AdamW(adam_params, betas=betas, eps=cfg.adam_eps, fused=device.type == "cuda")
        if use_muon:
            muon = Muon(matrices, **muon_kwargs)
        sync = NoSync()
    else:
        from ..optim.adam import DistAdam
        from ..optim.muon import DistMuon
        from ..parallel.ddp import GradSync

        sync = GradSync(world, get_rank(), device, comm_dtype=grad_comm_dtype)
        adam = DistAdam(adam_params, sync, betas=betas, eps=cfg.adam_eps,
                        defer_reduce=defer_adam_reduction(cfg, world, strategy, grads_read_each_step))
        if use_muon:
            muon = DistMuon(matrices, sync, **muon_kwargs)
    for opt in (adam, muon):
        for group in opt.param_groups if opt is not None else []:
            group["initial_lr"] = group["lr"]
    return Optimizers(adam, muon, {id(p): name for name, p in model.named_parameters()}, sync,
                      adam_every=cfg.adam_every, tied=model.tied_params)
