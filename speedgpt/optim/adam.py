"""DistAdam: AdamW with ZeRO-2-style sharded state for data-parallel training.

Each parameter is flattened and padded to a multiple of the world size W; rank r owns the
contiguous slice [r*S, (r+1)*S) with S = ceil(numel / W). Its gradient arrives averaged by a
reduce-scatter (launched from the backward hooks, see parallel/ddp.py), the rank updates only its
slice and keeps exp_avg / exp_avg_sq only for it, then an all-gather gives every rank the whole
updated parameter. Communication per step: one reduce-scatter + one all-gather = one all-reduce.

Adam every N steps (optim.adam_every, optim/container.py), with `defer_reduce`: on a step without an
update this rank's gradients are not reduced at all. Its buckets are held (GradSync.hold: no collective),
and each parameter's local, unreduced gradient is set aside (`unreduced`) and handed back as `.grad`
before the next step's backward (`begin_step`), which accumulates into it as into a micro-step's. The
update step's one reduce-scatter then carries the window's summed gradients: the mean over ranks of
the per-rank sums is the sum of the per-step means (up to float rounding). Why this over a separate
full-size sum packed in at launch: no copy (the gradient tensor itself waits) and no extra pass over it
in the launch. It is not free in memory: each rank keeps the sums whole where the reduced path kept a
1/W slice, live from the Adam step's first forward (up to ~720 MiB a GPU on 4 at speedrun-latest's
size, docs/distributed.md). Without `defer_reduce` (the gradients are read every
step: optim.grad_clip, the numerics guard's skip mode) each step reduces, and `pending` keeps this
rank's slice of the reduced sum.

The update is torch.optim.AdamW's (decoupled weight decay, bias correction); with W = 1 no
communication happens. `state_dict()` gathers the full, unsharded state in torch.optim's format
(so one file serves any world size, and torch's AdamW can load it); `load_state_dict()` takes a
full state and keeps this rank's slices.
"""

from __future__ import annotations

import math

import torch

from ..parallel.dist import all_gather, mean_over_ranks, reduce_scatter
from .container import add_pending, fold_local_grad


class DistAdam(torch.optim.Optimizer):
    def __init__(self, params, grad_sync, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, defer_reduce: bool = False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.grad_sync = grad_sync
        self.world_size, self.rank = grad_sync.world_size, grad_sync.rank
        # optim.adam_every > 1 (optim/container.py): per parameter, this rank's slice of the reduced
        # gradients of the steps since the last update, added in at the next step(); zeroed once used
        self.pending: dict[torch.Tensor, torch.Tensor] = {}
        # With defer_reduce (several ranks; build.defer_adam_reduction): no reduction on steps without an
        # update; per parameter this rank's own gradient sum of those steps, set aside between steps
        # (`begin_step` hands it back as .grad), and whether such a window is open (the same on every rank:
        # it decides the collectives of a checkpoint's `waiting_sum`).
        self.defer_reduce = defer_reduce and self.world_size > 1
        self.unreduced: dict[torch.Tensor, torch.Tensor] = {}
        self.window_open = False
        # model.tie_embed_frac, this step: {src: dst} whose reduced gradients are summed into dst's (fold_grad),
        # src taking no update of its own (the container copies dst's values into it), and the srcs done
        self._tied: dict[torch.Tensor, torch.Tensor] = {}
        self._folded: set[torch.Tensor] = set()
        self._bucket = {}
        for group in self.param_groups:
            for p in group["params"]:
                # One bucket per parameter: Adam's parameters here are few and large (embeddings, head);
                # the handful of scalars cost a few tiny collectives.
                self._bucket[p] = grad_sync.add_bucket([p], self._launch)

    # -- layout ---------------------------------------------------------------------------------
    def _shard(self, p: torch.Tensor) -> tuple[int, int, int]:
        """(S, start, n): shard size, this rank's first element, and how many real elements it owns."""
        S = math.ceil(p.numel() / self.world_size)
        lo = self.rank * S
        return S, lo, max(0, min(S, p.numel() - lo))

    def _launch(self, bucket):
        (p,) = bucket.params
        S, _, _ = self._shard(p)
        n = p.numel()
        buf = self.grad_sync.comm_buffer(S * self.world_size, p)  # bf16 with parallel.grad_comm_dtype=bf16
        grad = p.grad
        aside = self.unreduced.pop(p, None)  # a held sum `begin_step` did not hand back: it joins here
        if aside is not None:
            grad = aside if grad is None else aside.add_(grad)
        if grad is None:
            buf.zero_()
        else:
            # sum of grad/W = mean; scaled in the gradient's dtype, then cast into buf's
            torch.mul(grad.reshape(-1), 1.0 / self.world_size, out=buf[:n])
            buf[n:].zero_()
        bucket.out = self.grad_sync.comm_buffer(S, p)  # grad_sync.wait returns it in p's dtype
        return reduce_scatter(bucket.out, buf, async_op=True)

    def _params_in_launch_order(self):
        mine = {id(b): p for p, b in self._bucket.items()}
        return [(mine[id(b)], b) for b in self.grad_sync.launch_all() if id(b) in mine]

    def reduced_grads(self) -> list[torch.Tensor]:
        """This rank's slices of the averaged gradients (for distributed norm clipping)."""
        if self._held():
            raise RuntimeError("DistAdam.reduced_grads on a step whose reduction is deferred (optim.adam_every): "
                               "build it with defer_reduce=False where the gradients are read every step")
        self._fold()
        out = []
        for p, b in self._params_in_launch_order():
            g = self.grad_sync.wait(b)
            out.append(g[: self._shard(p)[2]])
        return out

    def fold_grad(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """A tied pair (optim/container.py), this step: this rank's slice of `src`'s reduced gradient is to be
        added into `dst`'s and zeroed, and `src` left out of the update (same shape, so the same slice of both).
        Done when the gradients are first read (`reduced_grads`) or else at `dst`'s update, which comes after
        every other parameter's: src (the embedding) is reduced last, and waiting for it first would hold the
        other updates back from overlapping its reduce-scatter."""
        self._tied[src] = dst

    @torch.no_grad()
    def _fold(self) -> None:
        for src, dst in self._tied.items():
            if src not in self._folded:
                n = self._shard(dst)[2]
                g_src = self.grad_sync.wait(self._bucket[src])
                self.grad_sync.wait(self._bucket[dst])[:n].add_(g_src[:n])
                g_src.zero_()  # norms and clipping see the pair's one gradient
                self._folded.add(src)

    def _update_order(self) -> list:
        """(parameter, bucket) in launch order, without the tied srcs, and the tied dsts last (see fold_grad)."""
        dsts = {id(d) for d in self._tied.values()}
        order = [(p, b) for p, b in self._params_in_launch_order() if p not in self._tied]
        return [x for x in order if id(x[0]) not in dsts] + [x for x in order if id(x[0]) in dsts]

    def _end_step(self) -> None:
        """Release the tied srcs' buckets (held until folded) and forget this step's pairs."""
        self._fold()
        for src in self._tied:
            self.grad_sync.release(self._bucket[src])
        self._tied.clear()
        self._folded.clear()

    # -- the update -----------------------------------------------------------------------------
    @staticmethod
    def _adamw(p: torch.Tensor, g: torch.Tensor, state: dict, group: dict) -> None:
        """torch.optim.AdamW's single-tensor update, in place on p (a parameter or a slice of one)."""
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        if "exp_avg" not in state:
            state["step"] = torch.tensor(0.0)  # on the CPU: reading it is no device sync
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        step = state["step"].item()
        if wd:
            p.mul_(1 - lr * wd)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = lr / (1 - beta1 ** step)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-step_size)

    def _group_of(self):
        return {id(p): g for g in self.param_groups for p in g["params"]}

    def begin_step(self, due: bool) -> None:
        """Before a step's first backward (optim.adam_every, `Optimizers.begin_step`): with defer_reduce the
        gradient sums set aside become the parameters' .grad again, for the backward to accumulate into,
        and on a step without an update (`due` False) Adam's buckets are held: no collective."""
        if not self.defer_reduce:
            return
        with torch.no_grad():
            for p, g in self.unreduced.items():
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
        self.unreduced.clear()
        self.window_open = False
        self.grad_sync.hold([] if due else list(self._bucket.values()))

    def _held(self) -> bool:
        return any(self.grad_sync.is_held(b) for b in self._bucket.values())

    @torch.no_grad()
    def stash_grads(self) -> None:
        """A step without an update (optim.adam_every): the parameters stay as they are (nothing to
        all-gather). Buckets held (`begin_step`): each local gradient (a tied embedding's folded into the
        head's, as fold_grad does for reduced ones) is set aside in `unreduced`, the buckets released
        unreduced. Otherwise the reduced gradients go into `pending`."""
        if self._held():
            for src, dst in self._tied.items():
                fold_local_grad(src, dst)
            self._tied.clear()
            for p, b in self._bucket.items():
                if p.grad is not None:
                    add_pending(self.unreduced, p, p.grad, copy=False)
                    p.grad = None  # the trainer's zero_grad must not clear it (set_to_none=False zeroes in place)
                self.grad_sync.release(b)
            self.window_open = True
            return
        if self.world_size == 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        add_pending(self.pending, p, p.grad)
            return
        self._fold()  # nothing to overlap: no update
        for p, b in self._update_order():
            add_pending(self.pending, p, self.grad_sync.wait(b)[: self._shard(p)[2]])
            self.grad_sync.release(b)
        self._end_step()

    def _with_pending(self, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        extra = self.pending.get(p)
        if extra is not None:
            g.add_(extra)
            extra.zero_()
        return g

    @torch.no_grad()
    def step(self, closure=None):
        groups = self._group_of()
        if self.world_size == 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._adamw(p, self._with_pending(p, p.grad), self.state[p], group)
            return
        gathers = []
        dsts = {id(d) for d in self._tied.values()}
        for p, b in self._update_order():
            if id(p) in dsts:
                self._fold()
            S, lo, n = self._shard(p)
            g = self.grad_sync.wait(b)
            self._with_pending(p, g[:n])
            # Also with n == 0 (a tiny parameter with fewer elements than ranks): every rank then
            # holds state for every parameter, so state_dict's gathers match across ranks.
            self._adamw(p.view(-1)[lo:lo + n], g[:n], self.state[p], groups[id(p)])
            # The reduced-gradient buffer (in p's dtype, whatever grad_comm_dtype) is free now: reuse it to
            # send the updated slice. The all-gather stays in p's dtype: every rank must hold the same weights.
            send = g
            send[:n].copy_(p.view(-1)[lo:lo + n])
            # Divisible sizes gather straight into the parameter; others via a padded buffer.
            direct = p.numel() == S * self.world_size and p.is_contiguous()
            full = p.view(-1) if direct else torch.empty(S * self.world_size, dtype=p.dtype, device=p.device)
            gathers.append((p, b, full, direct, send, all_gather(full, send, async_op=True)))
        for p, b, full, direct, send, work in gathers:
            self.grad_sync.wait_work(work)
            if not direct:
                p.view(-1).copy_(full[: p.numel()])
            self.grad_sync.release(b)
        self._end_step()

    # -- checkpoints: full state in torch.optim's format ----------------------------------------
    def state_dict(self) -> dict:
        """Collective when sharded: every rank must call it; every rank gets the full state."""
        sd = super().state_dict()
        if self.world_size == 1:
            return sd
        full = {}
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p, {})
                if "exp_avg" in st:
                    full[index] = {"step": st["step"].clone(),
                                   "exp_avg": self._gather(p, st["exp_avg"]),
                                   "exp_avg_sq": self._gather(p, st["exp_avg_sq"])}
                index += 1
        sd["state"] = full
        return sd

    def waiting_sum(self, p: torch.Tensor) -> torch.Tensor | None:
        """The full reduced (mean over ranks) sum of `p`'s gradients waiting for the next update, for a
        checkpoint; None when none waits. A collective on several ranks: every rank calls it for the same
        parameters in the same order (`pending` and `window_open` are alike on every rank)."""
        full = self._gather(p, self.pending[p]) if p in self.pending and self.world_size > 1 else self.pending.get(p)
        if self.window_open:
            local = self.unreduced.get(p)  # none on this rank (no gradient): zeros
            local = torch.zeros(p.shape, device=p.device) if local is None else local.float()
            mean = mean_over_ranks(local).to(p.dtype).view(p.shape)  # fp32 sum: one rounding, to p's dtype
            full = mean if full is None else full.add_(mean)
        return full

    def load_waiting_sum(self, waiting: dict[torch.Tensor, torch.Tensor]) -> None:
        """Replace the waiting gradients with full reduced sums (a checkpoint's, from any world size). With
        defer_reduce every rank sets the whole sum aside: the next update's reduce-scatter averages
        (sum + g_r) over ranks, which is sum + mean(g_r). Otherwise each rank keeps its slice in `pending`."""
        self.pending.clear()
        self.unreduced.clear()
        self.window_open = self.defer_reduce and bool(waiting)
        for p, g in waiting.items():
            g = g.to(p.device, p.dtype)
            if self.defer_reduce:
                self.unreduced[p] = g.reshape(p.shape).clone()
            else:
                _, lo, n = self._shard(p)
                self.pending[p] = g.reshape(-1)[lo:lo + n].clone()

    def _gather(self, p: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        S, _, n = self._shard(p)
        send = torch.zeros(S, dtype=part.dtype, device=p.device)
        send[:n].copy_(part.reshape(-1)[:n])
        out = torch.empty(S * self.world_size, dtype=part.dtype, device=p.device)
        all_gather(out, send, async_op=False)
        return out[: p.numel()].view(p.shape).clone()

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full (unsharded) state, from any world size or from torch's AdamW; keep this rank's slices."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if not st:
                    continue
                st["step"] = torch.tensor(float(st["step"]))  # host scalar, as _adamw keeps it
                if self.world_size > 1:
                    _, lo, n = self._shard(p)
                    for k in ("exp_avg", "exp_avg_sq"):
                        st[k] = st[k].reshape(-1)[lo:lo + n].clone()
