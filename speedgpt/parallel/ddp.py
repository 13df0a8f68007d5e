"""Overlapped gradient reduction without a DDP wrapper.

The sharded optimizers (optim/adam.py DistAdam, optim/muon.py DistMuon) describe their
communication as *buckets*: a list of parameters plus a `launch` function that packs their
gradients, divided by the world size, into one buffer and starts one async collective
(a reduce-scatter: every rank receives the averaged gradient of only the part it updates).
`GradSync` owns the buckets and the hooks:

* A `register_post_accumulate_grad_hook` on every parameter marks its gradient ready. When a
  bucket's last gradient is ready, during the LAST micro-step's backward only (the trainer calls
  `prepare(final=...)` before each backward), the bucket is launched, so communication runs
  while the backward computes earlier layers. Non-final micro-steps only accumulate.
* Buckets are launched strictly in one order on every rank: collectives are matched by issue
  order (NCCL), so a bucket that is ready early waits for its predecessors. The order is the
  completion order observed in the first synced backward (close to reverse registration order,
  but embeddings and per-layer scalars finish last), taken from rank 0 once.
* The optimizer waits only on the bucket it is about to use (`wait`). Buckets not launched by
  then (hooks not armed, or a parameter without a gradient: treated as zero) are all launched
  first, in order, so every rank issues the same sequence of collectives.
* A bucket's owner may `hold` it for one step (DistAdam on a step where Adam does not update,
  optim.adam_every): its gradients stay local, no collective is issued for it, the launch order
  skips it, and the owner releases it unreduced. Every rank holds the same buckets (the owner decides
  from the step number), so the sequence of collectives still matches. The launch order is agreed
  on a step that holds nothing: a held step's observed completion order would lack the held buckets.

Communication dtype (parallel.grad_comm_dtype): by default each bucket travels in its parameters'
dtype. With `comm_dtype=torch.bfloat16` the launch functions pack gradient/W (scaled in fp32, then
cast) into bf16 buffers from `comm_buffer`, the reduce-scatter sums in bf16 (half the bytes), and
`wait` turns the reduced slice back into the parameters' dtype once, before any optimizer reads it.
Only the reduce-scatter changes: the all-gather of updated parameters stays in their dtype.

No host syncs: hooks and waits only enqueue work (NCCL's wait makes the compute stream wait).
`timing=True` (the trainer sets it on logging steps) measures the time spent in waits with
CUDA events (gloo: host clock) and `comm_wait_ms()` reports it: communication that was NOT hidden.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist


class Bucket:
    """Parameters whose gradients travel in one collective, and that collective's per-step state."""

    def __init__(self, params: list[torch.Tensor], launch: Callable[["Bucket"], object], index: int):
        self.params = params
        self.launch_fn = launch  # packs grads, starts the collective, sets self.out; returns the Work
        self.index = index  # registration index: the fallback order
        self.reset()

    def reset(self) -> None:
        self.ready: set[int] = set()
        self.work = None
        self.out: torch.Tensor | None = None
        self.launched = False


class GradSync:
    """Bucketed, hook-driven, overlapped gradient reduction shared by the sharded optimizers."""

    def __init__(self, world_size: int, rank: int, device: torch.device, comm_dtype: torch.dtype | None = None):
        self.world_size, self.rank, self.device = world_size, rank, device
        self.comm_dtype = comm_dtype  # None: each bucket's gradients travel in their parameters' dtype
        self.buckets: list[Bucket] = []
        self._by_param: dict[int, Bucket] = {}
        self._hooks = []
        self.order: list[Bucket] | None = None  # agreed launch order, fixed after the first synced step
        self._observed: list[Bucket] = []  # completion order seen in the first synced backward
        self._held: set[int] = set()  # indexes of the buckets held this step (`hold`)
        self._active: list[Bucket] | None = None  # this step's launch order without the held buckets (cached)
        self._next = 0  # position in this step's launch order (`launch_order`) of the next bucket to launch
        self._released = 0
        self.armed = False
        self._timing = False
        self._timers: list = []

    @property
    def timing(self) -> bool:
        return self._timing

    @timing.setter
    def timing(self, on: bool) -> None:
        if on:
            self._timers.clear()  # report one step's waits, not leftovers of earlier timed steps
        self._timing = bool(on)

    # -- registration ---------------------------------------------------------------------------
    def add_bucket(self, params: list[torch.Tensor], launch: Callable[[Bucket], object]) -> Bucket:
        b = Bucket(list(params), launch, len(self.buckets))
        self.buckets.append(b)
        for p in b.params:
            if id(p) in self._by_param:
                raise ValueError(f"parameter of shape {tuple(p.shape)} is in two gradient buckets; give each "
                                 f"parameter to exactly one optimizer")
            self._by_param[id(p)] = b
            if self.world_size > 1:  # one rank: the optimizers read p.grad directly, nothing to launch
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))
        return b

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def comm_buffer(self, shape, param: torch.Tensor) -> torch.Tensor:
        """An empty buffer for reduce-scattering `param`'s gradient: in the communication dtype if one is
        set, else in the parameter's."""
        return torch.empty(shape, dtype=self.comm_dtype or param.dtype, device=param.device)

    # -- the trainer's side ---------------------------------------------------------------------
    def prepare(self, final: bool) -> None:
        """Call before each micro-step's backward: only the final one reduces gradients."""
        self.armed = bool(final)

    def hold(self, buckets: list[Bucket]) -> None:
        """This step only: `buckets` issue no collective (their hooks do nothing, the launch order skips them);
        their owner keeps their gradients and releases them unreduced. Call before the step's first backward,
        on every rank with the same buckets; an empty list holds nothing."""
        if self._next or self._released:
            raise RuntimeError("GradSync.hold after this step's collectives began: hold before the first backward")
        self._held = {b.index for b in buckets}
        self._active = None

    def is_held(self, b: Bucket) -> bool:
        return b.index in self._held

    def comm_wait_ms(self) -> float | None:
        """Milliseconds spent waiting for communication since the last call (None: nothing timed).
        Reading CUDA events synchronizes: call this on logging steps only."""
        return wait_ms(self.take_timers())

    def take_timers(self) -> list:
        """The timed step's waits, unread, handed over (reading them later, with `wait_ms`, lets a
        bench time steps back to back without a host sync between them)."""
        timers, self._timers = self._timers, []
        return timers

    # -- hooks ----------------------------------------------------------------------------------
    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if not self.armed:
            return
        b = self._by_param[id(p)]
        if b.index in self._held:
            return
        b.ready.add(id(p))
        if len(b.ready) < len(b.params):
            return
        if self.order is None:
            # Order not agreed yet: just record; everything is launched in the agreed order at step time.
            if b not in self._observed:
                self._observed.append(b)
            return
        order = self.launch_order()
        while self._next < len(order):
            nxt = order[self._next]
            if len(nxt.ready) < len(nxt.params):
                break
            self._launch(nxt)

    def _launch(self, b: Bucket) -> None:
        b.work = b.launch_fn(b)
        b.launched = True
        self._next += 1

    def _agree_order(self) -> None:
        """Fix the launch order: rank 0's observed completion order (registration order for the rest)."""
        if not self._observed:
            return  # nothing observed (hooks not armed): registration order this step, decide later
        seen = [b.index for b in self._observed]
        idx = seen + [b.index for b in self.buckets if b.index not in seen]
        t = torch.tensor(idx, dtype=torch.int64, device=self.device)
        dist.broadcast(t, src=0)  # once per run: ranks must agree even if their autograd orders differed
        self.order = [self.buckets[i] for i in t.tolist()]

    # -- the optimizer's side -------------------------------------------------------------------
    def launch_order(self) -> list[Bucket]:
        """This step's launch order: the agreed one (registration order until then), held buckets left out."""
        if self._active is None:
            order = self.order if self.order is not None else self.buckets
            self._active = [b for b in order if b.index not in self._held] if self._held else order
        return self._active

    def launch_all(self) -> list[Bucket]:
        """Launch, in order, every bucket the hooks did not (fixing the order on the first step);
        returns the launch order. The optimizers call this first, then wait bucket by bucket."""
        if self._next < len(self.launch_order()):
            self._launch_all()
        return self.launch_order()

    def _launch_all(self) -> None:
        if self.order is None and not self._held:
            self._agree_order()
            self._active = None
        for b in self.launch_order()[self._next:]:
            self._launch(b)

    def wait(self, b: Bucket) -> torch.Tensor:
        """The reduced gradient (this rank's part) of bucket `b`, once its collective has finished."""
        if b.index in self._held:
            raise RuntimeError("GradSync.wait on a bucket held this step: its gradients were not reduced")
        if not b.launched:
            self._launch_all()
        if b.work is not None:
            self.wait_work(b.work)
            b.work = None
        dtype = b.params[0].dtype
        if b.out.dtype != dtype:
            # Reduced in the communication dtype: back to the parameters' dtype, here only, so clipping,
            # the optimizers and the slice they all-gather (ranks must keep identical weights) see it.
            b.out = b.out.to(dtype)
        return b.out

    def wait_work(self, work) -> None:
        if work is None:
            return
        if not self.timing:
            work.wait()
        elif self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work.wait()  # NCCL: the current stream waits; the events bracket that stall
            end.record()
            self._timers.append((start, end))
        else:
            t0 = time.perf_counter()
            work.wait()
            self._timers.append((time.perf_counter() - t0) * 1e3)

    def release(self, b: Bucket) -> None:
        """The optimizer is done with `b` (a held bucket too, unreduced); after the last bucket the per-step
        state resets, holds included."""
        b.out = None
        self._released += 1
        if self._released >= len(self.buckets):
            for x in self.buckets:
                x.reset()
            self._next = 0
            self._released = 0
            self.armed = False
            if self._held and self.order is None:
                self._observed.clear()  # seen with buckets held: incomplete, observe a whole step instead
            self._held = set()
            self._active = None


def wait_ms(timers: list) -> float | None:
    """Milliseconds in the waits `take_timers` handed over (None: nothing timed); CUDA events
    synchronize when read."""
    if not timers:
        return None
    return sum(t[0].elapsed_time(t[1]) if isinstance(t, tuple) else t for t in timers)


class NoSync:
    """World size 1: nothing to reduce. Same interface as GradSync."""

    world_size = 1
    timing = False

    def prepare(self, final: bool) -> None:
        pass

    def comm_wait_ms(self) -> float | None:
        return None

    def take_timers(self) -> list:
        return []


def grad_sync_of(optimizers) -> GradSync | NoSync:
    """The GradSync the optimizers share (build_optimizers attaches it), or a no-op for one rank."""
    for opt in optimizers:
        sync = getattr(opt, "grad_sync", None)
        if sync is not None:
            return sync
    return NoSync()


@torch.no_grad()
def clip_grad_norm_(optimizers, max_norm: float) -> torch.Tensor:
    """Global-norm clipping that works on reduced, sharded gradients (no host sync).

    One rank: torch's clip_grad_norm_. Several: each rank holds a disjoint part of the averaged
    gradients (`opt.reduced_grads()`), so the squared norms are summed across ranks, and every
    part is scaled in place before the optimizers read it. Same coefficient as torch's."""
    sync = grad_sync_of(optimizers)
    if isinstance(sync, NoSync):
        params = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    parts = [g for opt in optimizers for g in opt.reduced_grads()]
    sq = torch.zeros((), device=sync.device, dtype=torch.float32)
    for g in parts:
        sq += g.float().square().sum()
    dist.all_reduce(sq)
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in parts:
        g.mul_(coef.to(g.dtype))
    return norm
