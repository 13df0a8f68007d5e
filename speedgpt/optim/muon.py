"""Muon: momentum SGD whose update for each hidden matrix is orthogonalized by Newton–Schulz.

The quintic iteration below pushes every singular value of the (normalized) update towards ~1
in a few bf16 matmuls, so each step moves all directions of a matrix by a similar amount.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from ..parallel.dist import all_gather, reduce_scatter

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(G: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Approximately orthogonalize the last two dims of G (batched). Singular values land in ~[0.7, 1.2].

    bf16 on GPUs (tensor cores; the iteration tolerates the rounding); fp32 on CPUs, whose bf16
    matmuls are slower than fp32 ones."""
    a, b, c = NS_COEFFS
    if dtype is None:
        dtype = torch.bfloat16 if G.is_cuda else torch.float32
    X = G.to(dtype)
    transposed = G.size(-2) > G.size(-1)
    if transposed:  # iterate on the wide orientation: the Gram matrix X X^T is then the small one
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if transposed:
        X = X.mT
    return X


def muon_lr_scale(shape: torch.Size) -> float:
    """Tall matrices get larger steps so the per-element update size does not shrink with fan-out."""
    return max(1.0, shape[-2] / shape[-1]) ** 0.5


class Muon(torch.optim.Optimizer):
    """Single-process Muon. Parameters of any rank >= 2; leading dims are a batch of matrices."""

    def __init__(self, params, lr: float = 0.05, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0):
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def momentum_direction(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> torch.Tensor:
        """Update the momentum buffer; return the (Nesterov) direction to orthogonalize."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad)
        buf = state["momentum_buffer"]
        buf.lerp_(grad, 1 - group["momentum"])
        return grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf

    def update_for(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> torch.Tensor:
        """Momentum + Newton–Schulz for one parameter; returns the orthogonalized step direction."""
        return newton_schulz(self.momentum_direction(p, grad, group), steps=group["ns_steps"])

    def apply_update(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        lr = group["lr"]
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        p.add_(update.to(p.dtype), alpha=-lr * muon_lr_scale(p.shape))

    @torch.no_grad()
    def step(self, closure=None):
        # Matrices of one shape (up to transposition) share one batched Newton–Schulz: a few large
        # launches instead of five iterations x three matmuls per matrix.
        for group in self.param_groups:
            by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    m, n = p.shape[-2:]
                    by_shape[(min(m, n), max(m, n), p.dtype, p.device)].append(p)
            for params in by_shape.values():
                dirs = [self.momentum_direction(p, p.grad, group) for p in params]
                wide = [d.reshape(-1, *d.shape[-2:]) for d in dirs]
                wide = [w.mT if w.size(-2) > w.size(-1) else w for w in wide]
                ortho = newton_schulz(torch.cat(wide), steps=group["ns_steps"])
                for p, d, chunk in zip(params, dirs, ortho.split([w.size(0) for w in wide])):
                    chunk = chunk.mT if d.size(-2) > d.size(-1) else chunk
                    self.apply_update(p, chunk.reshape(p.shape), group)


class DistMuon(Muon):
    """Muon for data-parallel training: each rank orthogonalizes its share of the matrices.

    The matrices of each param group are grouped by (shape, dtype) in reverse registration order
    (≈ the order backward produces their gradients) and cut into chunks of W = world size, the
    last chunk padded with empty slots. Slot r of every chunk belongs to rank r. Per chunk, one
    reduce-scatter (launched from the backward hooks, parallel/ddp.py) hands rank r the averaged
    gradient of its matrix; rank r runs momentum + Newton–Schulz and the update on it alone and
    keeps that matrix's momentum buffer; one all-gather of the updated matrices completes the
    step everywhere. With W = 1 every chunk is one matrix and no communication happens: the
    math is exactly Muon's. `state_dict()` is the full, unsharded Muon state (collective);
    `load_state_dict()` accepts a full state from any world size and keeps this rank's buffers.
    """

    def __init__(self, params, grad_sync, lr: float = 0.05, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                         weight_decay=weight_decay)
        self.grad_sync = grad_sync
        self.world_size, self.rank = grad_sync.world_size, grad_sync.rank
        # (group index, [params], bucket): an index, not the dict, because load_state_dict replaces
        # the group dicts and the trainer then sets lr/momentum on the new ones.
        self._chunks = []
        W = self.world_size
        for gi, group in enumerate(self.param_groups):
            by_kind: dict[tuple, list[torch.Tensor]] = {}
            for p in reversed(group["params"]):
                by_kind.setdefault((tuple(p.shape), p.dtype), []).append(p)
            for ps in by_kind.values():
                for i in range(0, len(ps), W):
                    chunk = ps[i:i + W]
                    self._chunks.append((gi, chunk, grad_sync.add_bucket(chunk, self._launch)))
        self._chunk_of = {id(b): (g, ps) for g, ps, b in self._chunks}

    def _launch(self, bucket):
        ps = bucket.params
        p0 = ps[0]
        buf = torch.empty((self.world_size, *p0.shape), dtype=p0.dtype, device=p0.device)
        for j, p in enumerate(ps):
            if p.grad is None:
                buf[j].zero_()
            else:
                torch.mul(p.grad, 1.0 / self.world_size, out=buf[j])  # sum of grad/W = mean
        buf[len(ps):].zero_()  # empty slots
        bucket.out = torch.empty(p0.shape, dtype=p0.dtype, device=p0.device)
        return reduce_scatter(bucket.out.view(-1), buf.view(-1), async_op=True)

    def _mine(self):
        """(group index, chunk params, bucket) in the agreed launch order."""
        return [(*self._chunk_of[id(b)], b) for b in self.grad_sync.launch_all() if id(b) in self._chunk_of]

    def reduced_grads(self) -> list[torch.Tensor]:
        """The averaged gradients of the matrices this rank owns (for distributed norm clipping)."""
        return [self.grad_sync.wait(b) for _, ps, b in self._mine() if self.rank < len(ps)]

    @torch.no_grad()
    def step(self, closure=None):
        if self.world_size == 1:
            return super().step(closure)
        gathers = []
        for gi, ps, b in self._mine():
            group = self.param_groups[gi]
            g = self.grad_sync.wait(b)
            if self.rank < len(ps):
                p = ps[self.rank]
                new = p.detach().clone()
                self.apply_update(new, self.update_for(p, g, group), group)  # same ops as Muon, off-place
            else:
                new = g  # an empty slot: send anything, nobody reads it
            full = torch.empty((self.world_size, *new.shape), dtype=new.dtype, device=new.device)
            gathers.append((ps, b, full, new, all_gather(full.view(-1), new.reshape(-1), async_op=True)))
        for ps, b, full, new, work in gathers:
            self.grad_sync.wait_work(work)
            for j, p in enumerate(ps):
                p.copy_(full[j])
            self.grad_sync.release(b)

    def state_dict(self) -> dict:
        """Collective when sharded: every rank must call it; every rank gets the full state."""
        sd = super().state_dict()
        if self.world_size == 1:
            return sd
        # Buffers exist after the first step on every owner alike, so this test agrees across ranks.
        has = any("momentum_buffer" in self.state.get(ps[self.rank], {}) for _, ps, _ in self._chunks
                  if self.rank < len(ps))
        flag = torch.tensor([int(has)], device=self._chunks[0][1][0].device) if self._chunks else None
        if flag is not None:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        index_of = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        full = {}
        if flag is not None and flag.item():
            for _, ps, _ in self._chunks:
                p0 = ps[0]
                send = torch.zeros_like(p0)
                if self.rank < len(ps) and "momentum_buffer" in self.state.get(ps[self.rank], {}):
                    send.copy_(self.state[ps[self.rank]]["momentum_buffer"])
                out = torch.empty((self.world_size, *p0.shape), dtype=p0.dtype, device=p0.device)
                all_gather(out.view(-1), send.view(-1), async_op=False)
                for j, p in enumerate(ps):
                    full[index_of[id(p)]] = {"momentum_buffer": out[j].clone()}
        sd["state"] = full
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full Muon state (any world size); keep only the buffers of this rank's matrices."""
        super().load_state_dict(state_dict)
        if self.world_size == 1:
            return
        for _, ps, _ in self._chunks:
            for j, p in enumerate(ps):
                if j != self.rank:
                    self.state.pop(p, None)
