"""Mixture-of-Experts MLP in the style of DeepSeek-V3 (arXiv:2412.19437, section 2.1.2).

- Routed experts: every token goes to the `top_k` experts with the highest sigmoid affinity
  s_e = sigmoid(x . r_e); the chosen affinities, normalized to sum to one, weight their outputs.
- A shared expert that every token passes through.
- Auxiliary-loss-free load balancing: a per-expert bias b_e is added to the affinities for the
  *choice* of experts only (never to the weights), and after each optimizer step it moves by
  `rate` towards balance: b_e += rate * sign(mean load - load_e). It is a buffer, outside the
  gradient; `balance_experts` applies it (the trainer calls it from an optimizer-step hook), with
  the loads summed over ranks so every rank keeps the same bias.
- Iso-FLOP width: each expert's hidden width is the dense MLP's divided by (top_k + shared), so
  a token's active MLP FLOPs equal the dense model's.
- Expert weights are 3-D (experts, out, in): Muon orthogonalizes each expert's matrix (its
  leading dims are a batch). The routers are Adam's, at their own small lr (optim.router_lr).
- Health: `moe_health` reports loads, the largest router logit, the bias spread and weight norms on
  logging steps, from device-side counters.
- Dispatch: tokens sorted by expert, then one `torch._grouped_mm` per projection over all experts
  (CUDA, bf16: one kernel each; it compiles in bf16 only), or a loop over experts (`grouped=False`; CPU),
  which torch.compile leaves out of its graph (the expert loop reads the counts on the host).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


def expert_hidden(dense_hidden: int, top_k: int, shared: int, multiple: int = 16) -> int:
    """Iso-FLOP expert width: the dense hidden width over the experts a token uses, rounded up to
    `multiple` (bf16 grouped matmuls want 16-byte-aligned rows)."""
    h = dense_hidden / (top_k + shared)
    return max(multiple, int(-(-h // multiple)) * multiple)


def router_logits(x_ND: torch.Tensor, router_ED: torch.Tensor) -> torch.Tensor:
    """The affinity logits x . r_e (N, E), in fp32."""
    return F.linear(x_ND.float(), router_ED.float())


def choose_experts(logits_NE: torch.Tensor, bias_E: torch.Tensor, top_k: int):
    """(expert ids (N, k), weights (N, k)): top-k of sigmoid affinity + bias, weights from the affinity
    alone, normalized over the chosen k.

    The normalization s_i / sum_j s_j is taken as a softmax of log-sigmoids: the same numbers, but
    where every chosen logit is below ~-88 the fp32 sigmoids underflow to 0 and the plain quotient
    is 0/0 = NaN (how moe-d12 diverged at step 186: docs/experiments.md), while this stays finite."""
    scores = torch.sigmoid(logits_NE)
    idx = torch.topk(scores + bias_E, top_k, dim=-1, sorted=False).indices
    return idx, torch.softmax(F.logsigmoid(logits_NE.gather(1, idx)), dim=-1)


def route(x_ND: torch.Tensor, router_ED: torch.Tensor, bias_E: torch.Tensor, top_k: int):
    """`choose_experts` on the router's logits for tokens x."""
    return choose_experts(router_logits(x_ND, router_ED), bias_E, top_k)


def experts_grouped(x_sorted: torch.Tensor, w1_EHD: torch.Tensor, w2_EDH: torch.Tensor,
                    counts_E: torch.Tensor) -> torch.Tensor:
    """All experts' ReLU² MLPs over expert-sorted rows, one grouped matmul per projection."""
    offs = torch.cumsum(counts_E, 0).to(torch.int32)
    h = torch._grouped_mm(x_sorted, w1_EHD.type_as(x_sorted).transpose(-2, -1), offs=offs)
    h = F.relu(h).square()
    return torch._grouped_mm(h, w2_EDH.type_as(h).transpose(-2, -1), offs=offs)


@torch.compiler.disable
def experts_loop(x_sorted: torch.Tensor, w1_EHD: torch.Tensor, w2_EDH: torch.Tensor,
                 counts_E: torch.Tensor) -> torch.Tensor:
    """The same as `experts_grouped`, one expert at a time (any device; reads the counts on the host).
    Never compiled: traced, each count read here becomes a guard on its value, so dynamo recompiled the
    code after it at nearly every step and, past its recompile limit (8), ran it eagerly anyway (issue 34).
    Left out, it is one graph break per MoE layer and no recompile."""
    outs, start = [], 0
    for e, n in enumerate(counts_E.tolist()):
        seg = x_sorted[start:start + n]
        h = F.relu(F.linear(seg, w1_EHD[e].type_as(seg))).square()
        outs.append(F.linear(h, w2_EDH[e].type_as(h)))
        start += n
    return torch.cat(outs)


class _Recompute:
    """Whether activation checkpointing is recomputing a block in the backward (see `recompute_marked`)."""
    active = False


@contextlib.contextmanager
def _recomputing():
    previous, _Recompute.active = _Recompute.active, True
    try:
        yield
    finally:
        _Recompute.active = previous


def recompute_marked():
    """torch.utils.checkpoint's context_fn for a block run in Python (eager, or each compiled block of
    compile_scope=block): the recompute in the backward runs marked, so MoE layers count their tokens
    once. A Python flag, not a look at autograd's graph task: dynamo reads and guards it without a graph
    break (torch._C._current_graph_task_id() was one, issue 34), and a compiled block recomputed in the
    backward is then a variant of its own."""
    return contextlib.nullcontext(), _recomputing()


class MoE(nn.Module):
    def __init__(self, dim: int, dense_hidden: int, experts: int, top_k: int, shared: int, *,
                 grouped: bool = False):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"MoE: top_k={top_k} must lie in 1..{experts} (the number of experts)")
        self.experts, self.top_k, self.grouped = experts, top_k, grouped
        hidden = expert_hidden(dense_hidden, top_k, shared)
        self.hidden = hidden
        self.router = nn.Parameter(torch.empty(experts, dim))
        self.w1 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(experts, dim, hidden))
        if shared:
            from .mlp import MLP

            self.shared = MLP(dim, hidden * shared)
        else:
            self.shared = None
        # Balancing state, outside the gradient: the bias is checkpointed; the loads are tokens routed
        # to each expert since the last balancing step (and since the last log, for the metrics).
        self.register_buffer("expert_bias", torch.zeros(experts), persistent=True)
        self.register_buffer("load", torch.zeros(experts), persistent=False)
        self.register_buffer("load_since_log", torch.zeros(experts), persistent=False)
        # The largest |router logit| of a training forward since the last log (`moe_health`): kept on the
        # device, so the steps between logs read nothing back.
        self.register_buffer("logit_max", torch.zeros(()), persistent=False)

    def init_plan(self, prefix: str = "") -> list:
        def uniform(t):
            bound = (3 ** 0.5) * 0.5 * t.size(-1) ** -0.5
            t.uniform_(-bound, bound)

        plan = [(prefix + "router", uniform), (prefix + "w1", uniform), (prefix + "w2", torch.Tensor.zero_)]
        return plan + (self.shared.init_plan(prefix + "shared.") if self.shared is not None else [])

    def init_buffers(self) -> None:
        for b in (self.expert_bias, self.load, self.load_since_log, self.logit_max):
            b.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_ND = x.reshape(-1, shape[-1])
        logits = router_logits(x_ND, self.router)
        idx, weights = choose_experts(logits, self.expert_bias, self.top_k)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // self.top_k  # the row each sorted assignment came from
        # scatter_add, not bincount: a static output shape, so a compiled block has no graph break here
        counts = torch.zeros(self.experts, dtype=torch.int64, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        # Count training forwards once: not again when activation checkpointing recomputes the block
        # inside the backward (`recompute_marked`).
        if self.training and torch.is_grad_enabled() and not _Recompute.active:
            self.load += counts
            self.logit_max.copy_(torch.maximum(self.logit_max, logits.detach().abs().amax()))
        x_sorted = x_ND[token]
        if self.grouped:
            out = experts_grouped(x_sorted, self.w1, self.w2, counts)
        else:
            out = experts_loop(x_sorted, self.w1, self.w2, counts)
        out = out * weights.reshape(-1)[order, None].to(out.dtype)
        y = torch.zeros_like(x_ND).index_add_(0, token, out.to(x_ND.dtype))
        if self.shared is not None:
            y = y + self.shared(x_ND)
        return y.view(shape)

    def active_params(self) -> int:
        """Parameters one token uses: router, top_k experts and the shared expert."""
        shared = sum(p.numel() for p in self.shared.parameters()) if self.shared is not None else 0
        return self.router.numel() + self.top_k * (self.w1[0].numel() + self.w2[0].numel()) + shared


@torch.no_grad()
def balance_experts(model: nn.Module, rate: float) -> None:
    """DeepSeek-V3's bias update for every MoE layer, from the loads since the last call, summed
    over ranks (one small all-reduce) so the biases stay identical everywhere."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        return
    loads = torch.stack([m.load for m in layers])
    from ..parallel.dist import is_distributed

    if is_distributed():
        torch.distributed.all_reduce(loads)
    mean = loads.mean(dim=1, keepdim=True)
    for m, load, mu in zip(layers, loads, mean):
        m.expert_bias += rate * torch.sign(mu - load)
        m.load_since_log += load
        m.load.zero_()


# The figures `moe_health` reports per MoE layer, in the order of its rows.
HEALTH_KEYS = ("moe_max_load", "moe_min_load", "moe_logit_max", "moe_bias_range", "moe_router_norm",
               "moe_w1_norm", "moe_w2_norm")


@torch.no_grad()
def moe_health(model: nn.Module) -> dict[str, list[float]]:
    """Per MoE layer, since the last call: the busiest and the idlest expert's share of the routed
    tokens over the mean share (moe_max_load, moe_min_load; 1.0 = balanced; summed over ranks by
    `balance_experts`), the largest |router logit| (moe_logit_max, the max over ranks: past ~7 the
    sigmoid affinities saturate, their gradient vanishes, and past ~88 they underflow in fp32), the spread max - min of the balancing
    biases (moe_bias_range: growing by 2 x moe_bias_rate every step means the bias cannot balance),
    and the largest per-expert Frobenius norm of the router rows and of w1 and w2. One host read
    (logging steps only); on several ranks one small all-reduce, and under FSDP a gather of the
    per-expert norms: a collective, every rank calls it."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        return {}
    loads = torch.stack([m.load_since_log for m in layers])
    share = loads / loads.mean(dim=1, keepdim=True).clamp_min(1e-9)
    logit_max = torch.stack([m.logit_max for m in layers])
    from ..parallel.dist import is_distributed
    from ..parallel.dtensor import full_tensor  # FSDP's parameters are shards: their norms are gathered

    if is_distributed():
        torch.distributed.all_reduce(logit_max, op=torch.distributed.ReduceOp.MAX)
    bias = torch.stack([m.expert_bias for m in layers])
    rows = torch.stack([share.amax(1), share.amin(1), logit_max, bias.amax(1) - bias.amin(1)]
                       + [torch.stack([full_tensor(torch.linalg.vector_norm(getattr(m, name).float(), dim=dims)).amax()
                                       for m in layers])
                          for name, dims in (("router", -1), ("w1", (-2, -1)), ("w2", (-2, -1)))])
    reset_health(model)
    return {key: [round(v, 4) for v in row] for key, row in zip(HEALTH_KEYS, rows.tolist())}


def reset_health(model: nn.Module) -> None:
    """Forget what the MoE layers counted since the last report (the trainer calls this after the
    compile warmup, whose steps are not the run's)."""
    for m in model.modules():
        if isinstance(m, MoE):
            m.load_since_log.zero_()
            m.logit_max.zero_()
