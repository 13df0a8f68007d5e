"""The optimizer section: Muon and Adam (or one AdamW), their lrs, decay and the later records' switches."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OptimConfig:
    muon_lr: float = 0.05
    muon_momentum: float = 0.95
    muon_momentum_start: float = 0.85
    muon_momentum_warmup_steps: int = 300
    muon_nesterov: bool = True
    muon_ns_steps: int = 5  # orthogonalization iterations (at most 5 with polar_express)
    muon_weight_decay: float = 0.0  # decoupled: p <- p - lr * wd * p each step
    # How Muon orthogonalizes: "newton_schulz" repeats one quintic whose singular values end in
    # ~[0.7, 1.2]; "polar_express" (Amsel et al. 2025; speedrun record 2025-09-29) uses a different,
    # minimax-optimal quintic per iteration and ends in ~[0.86, 1.14] for the same five matmul rounds.
    muon_ortho: str = "newton_schulz"
    # NorMuon (Li et al. 2025; speedrun records from 2025-10): orthogonalized updates still give some
    # output units (rows) much larger steps than others; keep an EMA of each row's mean squared update,
    # divide rows by its root, then restore the matrix's Frobenius norm so muon_lr keeps its meaning.
    normuon: bool = False
    normuon_beta2: float = 0.95  # EMA factor of the per-row second moment (the paper's default)
    # Cautious weight decay (Chen et al. 2025; speedrun records 2025-10-28, 2025-11-10): decay Muon's
    # matrices only where the parameter and its update have the same sign (the step already moves
    # them towards zero), so the decay never fights the update. Needs muon_weight_decay > 0.
    cautious_wd: bool = False
    # Muon's weight decay over training: "constant", or "lr": multiplied by the lr schedule's
    # multiplier, so it shrinks in the cooldown with the lr (the 2025-11-10 record's finding; its
    # decay per step is then lr * wd * multiplier, quadratic in the schedule), or "linear": falling
    # linearly from muon_weight_decay at step 0 to zero at the last step (nanochat's depth ladder).
    wd_schedule: str = "constant"
    embed_lr: float = 0.3
    value_embed_lr: float = 0.3
    head_lr: float = 0.008
    scalar_lr: float = 0.04
    # Adam lr of the MoE routers (experts x width matrices that make the routing logits). Adam moves
    # each entry by up to lr a step, so a logit x . r_e (x of unit RMS) by up to ~0.8 x lr x width:
    # 0.2 at width 768. At the scalars' 0.04 (~25 a step) the sigmoid affinities saturated and
    # moe-d12's logits grew until fp32 underflow (docs/experiments.md, "moe-d12's divergence").
    router_lr: float = 3e-4
    adam_beta1: float = 0.8
    adam_beta2: float = 0.95
    adam_eps: float = 1e-10
    adam_weight_decay: float = 0.0
    # Adam's parameters step every N optimizer steps, on the sum of the N steps' gradients (record #39: 2,
    # Muon still every step); 1: every step
    adam_every: int = 1
    grad_clip: float = 0.0  # global-norm clipping; 0 disables
    # Muon's per-matrix lr factor max(1, rows/cols)^0.5: "rows_over_cols" on this model's (out, in)
    # layout; "record28" on record #28's layout, which stores the MLP input weight as (in, out): factor
    # 1 there instead of 2 (every other matrix is the same in both).
    muon_shape_factor: str = "rows_over_cols"
    # Newton-Schulz lines as fused multiply-adds (addmm/baddbmm, one rounding each), as record #28 and
    # torch.optim.Muon compute them; off: separate bf16 multiplies and adds.
    muon_ns_fused: bool = False
    # Depth-knob learning-rate scaling: Adam lrs scale with (768 / model_dim) ** 0.5 when on.
    scale_lr_by_width: bool = False
    # The width the lrs and Muon weight decay were tuned at (0: off). The budget resolution (budget.py)
    # scales Adam lrs by (tuned_width / width) ** 0.5 and muon_weight_decay by (tuned_width / width) ** 2,
    # writes the scaled values into the run's config and sets this back to 0.
    tuned_width: int = 0
    # Which optimizers: "muon" (Muon for hidden matrices, Adam for the rest: the speedrun's) or
    # "adamw" (one AdamW for every parameter, the large-model recipe: optim.adamw_lr for all,
    # betas optim.adam_beta1/adam_beta2, decoupled decay optim.adamw_weight_decay on matrices only).
    kind: str = "muon"
    adamw_lr: float = 3e-4
    adamw_weight_decay: float = 0.1
    # Adam lrs of the later records' parameters (used only when their switch is on): the record's
    # base lr 0.008 x its lr_mul (bigram table 75, smear gate 0.01, skip gate 0.05, value-embedding gates 1).
    bigram_embed_lr: float = 0.6
    smear_gate_lr: float = 8e-5
    skip_gate_lr: float = 4e-4
    value_embed_gate_lr: float = 0.008
