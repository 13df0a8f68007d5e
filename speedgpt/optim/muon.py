"""Muon: momentum SGD whose update for each hidden matrix is orthogonalized by an odd matrix polynomial.

The quintic iterations below push every singular value of the (normalized) update towards ~1
in a few bf16 matmuls, so each step moves all directions of a matrix by a similar amount.
Three switches from the later speedrun records, all off by default (OptimConfig says why):
Polar Express coefficients (`ortho`), NorMuon's per-row normalization (`normuon`) and
cautious weight decay (`cautious_wd`).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from ..parallel.dist import all_gather, reduce_scatter

NS_COEFFS = (3.4445, -4.7750, 2.0315)

# Polar Express (Amsel, Persson, Musco, Gower 2025, "The Polar Express: Optimal Matrix Sign Methods
# and Their Application to the Muon Algorithm", arXiv:2505.16932): a different odd quintic
# p_t(x) = a x + b x^3 + c x^5 per iteration, each the minimax-optimal one for the interval the
# previous ones leave. These are the five used by modded-nanogpt since its 2025-09-29 record
# (train_gpt.py, "Computed for num_iters=5, safety_factor=2e-2, cushion=2"). The paper's own
# Algorithm 1 uses a slightly different set (its raw coefficients divided by 1.01, 1.01^3, 1.01^5
# and a 1.01 normalization); the two are close, this one matches the speedrun.
POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
# The same record divides by 1.02 x the Frobenius norm (plus 1e-6), not by the norm itself: the first
# polynomial is fitted on [0, 1] and grows fast past it (p_1(1) = 1.55, p_1(1.1) = 4.6), so the 2%
# margin keeps bf16 rounding from pushing the top singular value out of the fitted interval.
POLAR_EXPRESS_SAFETY = 1.02
ORTHO_METHODS = ("newton_schulz", "polar_express")


def _odd_quintic_iterations(G: torch.Tensor, coeffs, inflate: float, eps: float,
                            dtype: torch.dtype | None, fused: bool = False) -> torch.Tensor:
    """X <- a_t X + (b_t A + c_t A^2) X with A = X X^T, for each (a_t, b_t, c_t) in coeffs, batched
    over the leading dims, after scaling X so its spectral norm is at most 1/inflate.

    bf16 on GPUs (tensor cores; the iteration tolerates the rounding); fp32 on CPUs, whose bf16
    matmuls are slower than fp32 ones.

    fused: each line as one multiply-add with a single rounding (addmm / baddbmm: B = b A + c A A,
    X = a X + B X), as record #28's Triton kernels and torch.optim.Muon compute it; the separate
    multiplies and adds round each partial result to bf16 (singular values of rectangular updates
    end ~0.6 % lower on average, measured against fp64)."""
    if dtype is None:
        dtype = torch.bfloat16 if G.is_cuda else torch.float32
    X = G.to(dtype)
    transposed = G.size(-2) > G.size(-1)
    if transposed:  # iterate on the wide orientation: the Gram matrix X X^T is then the small one
        X = X.mT
    norm = X.norm(dim=(-2, -1), keepdim=True)  # spectral norm <= Frobenius norm
    X = X / ((norm * inflate if inflate != 1.0 else norm) + eps)
    for a, b, c in coeffs:
        A = X @ X.mT
        if fused:
            addmm = torch.baddbmm if X.ndim == 3 else torch.addmm
            if X.ndim > 3:
                raise ValueError(f"fused Newton-Schulz takes 2D or 3D updates, got shape {tuple(X.shape)}")
            B = addmm(A, A, A, beta=b, alpha=c)
            X = addmm(X, B, X, beta=a)
        else:
            B = b * A + c * (A @ A)
            X = a * X + B @ X
    if transposed:
        X = X.mT
    return X


def newton_schulz(G: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = None,
                  fused: bool = False) -> torch.Tensor:
    """Approximately orthogonalize the last two dims of G (batched) with one fixed quintic repeated
    `steps` times. Singular values land in ~[0.7, 1.2]."""
    return _odd_quintic_iterations(G, [NS_COEFFS] * steps, 1.0, eps, dtype, fused)


def polar_express(G: torch.Tensor, steps: int = 5, eps: float = 1e-6, dtype: torch.dtype | None = None,
                  fused: bool = False) -> torch.Tensor:
    """Approximately orthogonalize the last two dims of G (batched) with the first `steps` (<= 5)
    Polar Express polynomials: same cost per iteration as newton_schulz; after all five, singular
    values land in ~[0.86, 1.14]. The set is tuned for five: intermediate iterates overshoot
    (p_1(1) = 1.55), so fewer steps is a truncation, not a smaller optimal method."""
    if not 1 <= steps <= len(POLAR_EXPRESS_COEFFS):
        raise ValueError(f"polar_express: steps={steps}, but coefficients exist for 1..{len(POLAR_EXPRESS_COEFFS)} "
                         f"iterations; use muon_ns_steps <= {len(POLAR_EXPRESS_COEFFS)} or newton_schulz")
    return _odd_quintic_iterations(G, POLAR_EXPRESS_COEFFS[:steps], POLAR_EXPRESS_SAFETY, eps, dtype, fused)


def orthogonalize(G: torch.Tensor, method: str = "newton_schulz", steps: int = 5, fused: bool = False) -> torch.Tensor:
    if method == "newton_schulz":
        return newton_schulz(G, steps=steps, fused=fused)
    if method == "polar_express":
        return polar_express(G, steps=steps, fused=fused)
    raise ValueError(f"unknown orthogonalization '{method}'; use one of {', '.join(ORTHO_METHODS)}")


def normuon_normalize(update: torch.Tensor, second_moment: torch.Tensor, beta2: float,
                      eps: float = 1e-10) -> torch.Tensor:
    """NorMuon (Li et al. 2025, "NorMuon: Making Muon more efficient and scalable", arXiv:2510.05491):
    equalize the per-neuron update size that orthogonalization leaves uneven.

    `update` (..., m, n) is an orthogonalized update in the parameter's own (out, in) layout, so
    row i is output unit i. `second_moment` (..., m, 1), fp32, is updated in place to an EMA of each
    row's mean squared entry; the rows are divided by sqrt(EMA + eps), then each matrix is rescaled
    to the Frobenius norm it had before (as the authors' normuon.py and modded-nanogpt do), so the
    learning rate keeps Muon's meaning. That per-matrix rescale also cancels the EMA's zero-start
    bias (a scalar per matrix), which is why there is no bias correction. Returns a new fp32 tensor."""
    u = update.float()
    second_moment.lerp_(u.square().mean(dim=-1, keepdim=True), 1 - beta2)
    scaled = u * (second_moment + eps).rsqrt()
    before = u.norm(dim=(-2, -1), keepdim=True)
    after = scaled.norm(dim=(-2, -1), keepdim=True)
    return scaled * (before / after.clamp_min(eps))


def muon_lr_scale(shape: torch.Size, transposed: bool = False) -> float:
    """Tall matrices get larger steps so the per-element update size does not shrink with fan-out.
    `transposed`: take the ratio on the transposed matrix (a parameter group's `shape_transposed`:
    record #28 stores the MLP's input weight as (in, out) = (768, 3072), so its factor is 1 where
    this model's (3072, 768) weight would get 2)."""
    rows, cols = (shape[-1], shape[-2]) if transposed else (shape[-2], shape[-1])
    return max(1.0, rows / cols) ** 0.5


def batch_key(p: torch.Tensor) -> tuple:
    """Matrices with equal keys share one batched orthogonalization (Muon.updates_for): same shape up to
    transposition, dtype and device. The device differs between ranks (cuda:r): DistMuon groups by this key
    but orders its batches by the agreed launch order, never by the key."""
    m, n = p.shape[-2:]
    return min(m, n), max(m, n), p.dtype, p.device


class Muon(torch.optim.Optimizer):
    """Single-process Muon. Parameters of any rank >= 2; leading dims are a batch of matrices.

    ortho: "newton_schulz" | "polar_express" (the polynomial iteration; ns_steps iterations).
    normuon: divide each output row of the orthogonalized update by the root of an EMA (beta2) of
        its mean square, keeping the matrix's Frobenius norm (normuon_normalize).
    weight_decay: decoupled, p <- p - lr * weight_decay * p; the trainer may schedule it
        (optim.wd_schedule). cautious_wd: decay only where p and the update have the same sign.
    """

    def __init__(self, params, lr: float = 0.05, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0, ortho: str = "newton_schulz",
                 normuon: bool = False, normuon_beta2: float = 0.95, cautious_wd: bool = False,
                 ns_fused: bool = False):
        if ortho not in ORTHO_METHODS:
            raise ValueError(f"Muon: unknown ortho='{ortho}'; use one of {', '.join(ORTHO_METHODS)}")
        if not 0.0 < normuon_beta2 < 1.0:
            raise ValueError(f"Muon: normuon_beta2={normuon_beta2} must lie in (0, 1)")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, weight_decay=weight_decay,
                        ortho=ortho, normuon=normuon, normuon_beta2=normuon_beta2, cautious_wd=cautious_wd,
                        ns_fused=ns_fused, shape_transposed=False)
        super().__init__(params, defaults)

    def momentum_directions(self, params: list[torch.Tensor], grads: list[torch.Tensor], group: dict) -> list:
        """Update the parameters' momentum buffers; return the (Nesterov) directions to orthogonalize.
        Multi-tensor ops: one launch for all of them, not two per matrix."""
        bufs = []
        for p, g in zip(params, grads):
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(g)
            bufs.append(state["momentum_buffer"])
        if not bufs:
            return []
        grads = list(grads)
        torch._foreach_lerp_(bufs, grads, 1 - group["momentum"])
        if not group["nesterov"]:
            return bufs
        # grad.lerp(buf, momentum) as a copy, then in place: torch 2.11's DTensor (ShardedMuon under FSDP) has
        # sharding rules for _foreach_mul and _foreach_lerp_, none for the out-of-place _foreach_lerp.
        dirs = list(torch._foreach_mul(grads, 1.0))
        torch._foreach_lerp_(dirs, bufs, group["momentum"])
        return dirs

    @staticmethod
    def state_layout(p: torch.Tensor) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Every per-matrix state tensor Muon may keep: name -> (shape, dtype). DistMuon gathers these."""
        return {"momentum_buffer": (tuple(p.shape), p.dtype),
                "second_momentum_buffer": ((*p.shape[:-1], 1), torch.float32)}

    def normalize(self, params: list[torch.Tensor], updates: list[torch.Tensor], group: dict) -> list:
        """NorMuon's per-row normalization of each parameter's orthogonalized update (identity when it is off).
        The updates of one shape go through it stacked: one set of launches for a batch, not one a matrix
        (the reductions are per row and per matrix, so stacking changes no matrix's math)."""
        if not group["normuon"]:
            return list(updates)
        out = list(updates)
        by_shape: dict[tuple, list[int]] = defaultdict(list)
        for i, u in enumerate(updates):
            by_shape[tuple(u.shape)].append(i)
        for idx in by_shape.values():
            moments = [self._second_moment(params[i], updates[i]) for i in idx]
            if len(idx) == 1:
                out[idx[0]] = normuon_normalize(updates[idx[0]], moments[0], group["normuon_beta2"])
                continue
            stacked = torch.stack(moments)  # the EMAs move in the stack, then back into each one's state
            done = normuon_normalize(torch.stack([updates[i] for i in idx]), stacked, group["normuon_beta2"])
            torch._foreach_copy_(moments, list(stacked.unbind(0)))
            for i, u in zip(idx, done.unbind(0)):
                out[i] = u
        return out

    def _second_moment(self, p: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        state = self.state[p]
        if "second_momentum_buffer" not in state:
            shape, dtype = self.state_layout(p)["second_momentum_buffer"]
            # On the update's device: under FSDP (ShardedMuon) p is a shard and the update a whole matrix.
            state["second_momentum_buffer"] = torch.zeros(shape, dtype=dtype, device=update.device)
        return state["second_momentum_buffer"]

    def updates_for(self, params: list[torch.Tensor], grads: list[torch.Tensor], group: dict) -> list[torch.Tensor]:
        """Momentum + orthogonalization (+ NorMuon) for matrices of one shape up to transposition; returns
        each one's step direction in its own layout. One batched orthogonalization for all of them: a few
        large launches instead of ns_steps iterations x three matmuls per matrix (the norm and the
        products are per matrix, so batching changes no matrix's math)."""
        dirs = self.momentum_directions(params, grads, group)
        wide = [d.reshape(-1, *d.shape[-2:]) for d in dirs]
        wide = [w.mT if w.size(-2) > w.size(-1) else w for w in wide]
        ortho = orthogonalize(torch.cat(wide), group["ortho"], group["ns_steps"], group.get("ns_fused", False))
        out = []
        for p, d, chunk in zip(params, dirs, ortho.split([w.size(0) for w in wide])):
            chunk = chunk.mT if d.size(-2) > d.size(-1) else chunk
            out.append(chunk.reshape(p.shape))
        # NorMuon's rows are the parameter's own rows, so it runs after transposing back.
        return self.normalize(params, out, group)

    def apply_update(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        lr = group["lr"]
        if group["weight_decay"]:
            if group["cautious_wd"]:
                # Cautious weight decay (Chen et al. 2025, arXiv:2510.12402, Algorithm 1):
                # x <- x - lr * (u + wd * 1[u * x >= 0] * x). Decay only the coordinates the step
                # already moves towards zero; elsewhere it would fight the update.
                agree = (update * p) >= 0
                p.sub_(torch.where(agree, p, 0.0), alpha=lr * group["weight_decay"])
            else:
                p.mul_(1 - lr * group["weight_decay"])
        p.add_(update.to(p.dtype), alpha=-lr * muon_lr_scale(p.shape, group.get("shape_transposed", False)))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            by_shape: dict[tuple, list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    by_shape[batch_key(p)].append(p)
            for params in by_shape.values():
                for p, update in zip(params, self.updates_for(params, [p.grad for p in params], group)):
                    self.apply_update(p, update, group)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load, keeping NorMuon's second moments in fp32 (torch casts every state tensor to
        its parameter's dtype; they are kept in fp32 whatever the parameter's, see state_layout)."""
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        for i, saved in state_dict["state"].items():
            st = self.state.get(params[int(i)], {})
            buf = st.get("second_momentum_buffer")
            if buf is not None and buf.dtype != torch.float32:
                st["second_momentum_buffer"] = saved["second_momentum_buffer"].to(
                    device=buf.device, dtype=torch.float32, copy=True)


class DistMuon(Muon):
    """Muon for data-parallel training: each rank orthogonalizes its share of the matrices.

    The matrices of each param group are grouped by (shape, dtype) in reverse registration order
    (≈ the order backward produces their gradients) and cut into chunks of W = world size, the
    last chunk padded with empty slots. Slot r of every chunk belongs to rank r. Per chunk, one
    reduce-scatter (launched from the backward hooks, parallel/ddp.py) hands rank r the averaged
    gradient of its matrix; rank r runs momentum + orthogonalization (+ NorMuon) and the update on
    its matrices (those of one shape batched, as Muon does) and keeps their state (momentum and
    NorMuon buffers); one all-gather per batch of the updated matrices completes the step everywhere.
    With W = 1 every chunk is one matrix and no communication happens: the math is exactly Muon's.
    `state_dict()` is the full, unsharded Muon state (collective); `load_state_dict()` accepts a full
    state from any world size and keeps this rank's buffers.
    """

    def __init__(self, params, grad_sync, lr: float = 0.05, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0, ortho: str = "newton_schulz",
                 normuon: bool = False, normuon_beta2: float = 0.95, cautious_wd: bool = False,
                 ns_fused: bool = False):
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                         weight_decay=weight_decay, ortho=ortho, normuon=normuon, normuon_beta2=normuon_beta2,
                         cautious_wd=cautious_wd, ns_fused=ns_fused)
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
        buf = self.grad_sync.comm_buffer((self.world_size, *p0.shape), p0)  # bf16 with grad_comm_dtype=bf16
        for j, p in enumerate(ps):
            if p.grad is None:
                buf[j].zero_()
            else:
                # sum of grad/W = mean; scaled in the gradient's dtype, then cast into buf's
                torch.mul(p.grad, 1.0 / self.world_size, out=buf[j])
        if len(ps) < self.world_size:
            buf[len(ps):].zero_()  # empty slots
        bucket.out = self.grad_sync.comm_buffer(p0.shape, p0)  # grad_sync.wait returns it in p0's dtype
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
        # This rank's matrices are batched as Muon batches them: one `updates_for` per param group and shape
        # (up to transposition), not one per chunk. Per chunk, a rank's update was ~50 small launches, and
        # wave 9's 4-GPU profile had the host issuing them slower than the GPU ran them (20-40 ms of host
        # time a step under the profiler, for ~3.5 ms of GPU work): the rank whose host fell behind held
        # everyone's all-gathers.
        # A batch waits for its chunks' reduce-scatters, so batches run in the order their last chunk was
        # launched; each batch's all-gathers start when it is done and overlap the next batch's work.
        batches: dict[tuple, list] = {}
        ready_at: dict[tuple, int] = {}
        for i, (gi, ps, b) in enumerate(self._mine()):
            key = (gi, batch_key(ps[0]))
            batches.setdefault(key, []).append((ps, b))
            ready_at[key] = i
        gathers = []
        for key in sorted(batches, key=ready_at.__getitem__):
            group = self.param_groups[key[0]]
            chunks = batches[key]
            grads = [self.grad_sync.wait(b) for _, b in chunks]
            owned = [(ps[self.rank], g) for (ps, _), g in zip(chunks, grads) if self.rank < len(ps)]
            updates = iter(self.updates_for([p for p, _ in owned], [g for _, g in owned], group) if owned else [])
            # One all-gather for the batch, not one per chunk: rank r sends its slot of every chunk back to back,
            # updated in place in the send buffer (in the parameters' dtype even with grad_comm_dtype=bf16:
            # every rank must hold the same weights). An empty slot is sent as it is; nobody reads it.
            sizes = [ps[0].numel() for ps, _ in chunks]
            p0 = chunks[0][0][0]
            send = torch.empty(sum(sizes), dtype=p0.dtype, device=p0.device)
            for (ps, _), part in zip(chunks, send.split(sizes)):
                if self.rank < len(ps):
                    p = ps[self.rank]
                    new = part.view(p.shape)
                    new.copy_(p)
                    self.apply_update(new, next(updates), group)  # the same ops as Muon, off-place
            full = torch.empty((self.world_size, send.numel()), dtype=send.dtype, device=send.device)
            gathers.append((chunks, sizes, full, send, all_gather(full.view(-1), send, async_op=True)))
        for chunks, sizes, full, send, work in gathers:
            self.grad_sync.wait_work(work)
            params, parts = [], []
            for j in range(self.world_size):
                for (ps, _), part in zip(chunks, full[j].split(sizes)):
                    if j < len(ps):
                        params.append(ps[j])
                        parts.append(part.view(ps[j].shape))
            torch._foreach_copy_(params, parts)  # one multi-tensor launch for the batch's matrices
            for _, b in chunks:
                self.grad_sync.release(b)

    def state_dict(self) -> dict:
        """Collective when sharded: every rank must call it; every rank gets the full state."""
        sd = super().state_dict()
        if self.world_size == 1:
            return sd
        # Which state tensors exist (momentum after the first step; NorMuon's second moments when it
        # is on): one MAX-reduced flag per name, because a rank that owns no matrix has none.
        names = list(self.state_layout(self._chunks[0][1][0])) if self._chunks else []
        owned = [ps[self.rank] for _, ps, _ in self._chunks if self.rank < len(ps)]
        flags = None
        if names:
            flags = torch.tensor([int(any(k in self.state.get(p, {}) for p in owned)) for k in names],
                                 device=self._chunks[0][1][0].device)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        present = [k for k, f in zip(names, flags.tolist() if flags is not None else []) if f]
        index_of = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        full: dict[int, dict[str, torch.Tensor]] = {}
        for _, ps, _ in self._chunks:
            p0 = ps[0]
            layout = self.state_layout(p0)
            for k in present:
                shape, dtype = layout[k]
                send = torch.zeros(shape, dtype=dtype, device=p0.device)
                if self.rank < len(ps) and k in self.state.get(ps[self.rank], {}):
                    send.copy_(self.state[ps[self.rank]][k])
                out = torch.empty((self.world_size, *shape), dtype=dtype, device=p0.device)
                all_gather(out.view(-1), send.view(-1), async_op=False)
                for j, p in enumerate(ps):
                    full.setdefault(index_of[id(p)], {})[k] = out[j].clone()
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
