"""Muon: momentum SGD whose update for each hidden matrix is orthogonalized by Newton–Schulz.

The quintic iteration below pushes every singular value of the (normalized) update towards ~1
in a few bf16 matmuls, so each step moves all directions of a matrix by a similar amount.
"""

from __future__ import annotations

import torch

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

    def update_for(self, p: torch.Tensor, grad: torch.Tensor, group: dict) -> torch.Tensor:
        """Momentum + Newton–Schulz for one parameter; returns the orthogonalized step direction."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad)
        buf = state["momentum_buffer"]
        buf.lerp_(grad, 1 - group["momentum"])
        g = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
        return newton_schulz(g, steps=group["ns_steps"])

    def apply_update(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        lr = group["lr"]
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        p.add_(update.to(p.dtype), alpha=-lr * muon_lr_scale(p.shape))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.apply_update(p, self.update_for(p, p.grad, group), group)
