"""The run's optimizers as one object: `adam` (embeddings, head, scalars) and `muon` (hidden matrices).

Each member is whichever implementation suits the world size (torch's AdamW and Muon on one rank,
the sharded DistAdam and DistMuon on several); the trainer, the checkpoints and gradient clipping
see only this container.

Checkpoint format (`state_dict`): per member, the per-parameter state (moments, momentum buffers,
step counts) keyed by parameter name, in full (unsharded) form. Hyperparameters are not in it:
they come from the config and the schedules, which the trainer applies every step, and each
implementation keeps its own settings (fused kernels, algorithm switches) across a load. So a
checkpoint moves between world sizes and implementations with nothing to repair.

Adam every N steps (optim.adam_every, record #39): on the other steps the Adam parameters' gradients
wait and Adam does not step; on its step their sum joins the step's gradient. One rank and fsdp: the
reduced gradients are summed into `pending`. The sharded DistAdam (optim/adam.py) with
`defer_reduce` (build.defer_adam_reduction) issues no collective for them on those steps: each rank
keeps its own unreduced sum, which the next Adam step's one reduce-scatter averages (the trainer
calls `begin_step(step)` before each step's backward, which holds Adam's buckets when Adam is not
due); without it (gradients read every step: clipping, the numerics guard's skip mode) it keeps its
slice of the reduced sum in `pending`. The waiting sum is part of the state, always reduced and
whole (`"adam_pending": {name: {"grad": full tensor}}`; a collective reduces the local sums at save;
a tied embedding has no entry, its gradient waiting in the head's, on every world size and strategy),
so a checkpoint taken between two Adam steps resumes on any world size: exactly on one rank, up to
the float rounding of the sums' order on several.

A tied pair (model.tie_embed_frac: `tied()` gives (embedding, head) while tied): the embedding's
reduced gradient is added into the head's before anything reads the gradients (`fold_tied_grads`:
the trainer calls it before clipping, `step` otherwise), the embedding takes no step of its own, and
after each Adam update it is given the head's values on every rank. So it equals the head throughout
the tied phase, the head's gradient (and its waiting sum) holds both uses, as one shared table's
would, and the model's forward reads the embedding in both phases (one compiled graph).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


def add_pending(pending: dict[torch.Tensor, torch.Tensor], p: torch.Tensor, g: torch.Tensor, copy: bool = True) -> None:
    """Add gradient `g` of `p` to the sum waiting for Adam's next step (optim.adam_every); copy=False: a
    new sum is `g` itself (the caller hands it over)."""
    if p in pending:
        pending[p].add_(g)
    else:
        pending[p] = g.clone() if copy else g


def fold_local_grad(src: torch.Tensor, dst: torch.Tensor) -> None:
    """A tied pair's gradients where they are whole on this rank (one rank, fsdp's reduced shards of one
    layout, DistAdam's unreduced gradients): `src`'s joins `dst`'s, and `src` has none left."""
    if src.grad is None:
        return
    if dst.grad is None:
        dst.grad = src.grad.to(dst.dtype)
    else:
        dst.grad.add_(src.grad)
    src.grad = None


class Optimizers:
    def __init__(self, adam: torch.optim.Optimizer, muon: torch.optim.Optimizer | None, names: dict[int, str],
                 grad_sync, adam_every: int = 1, tied: Callable[[], tuple | None] | None = None):
        self.adam = adam
        self.tied = tied or (lambda: None)  # () -> (embedding, head) while tied (GPT.tied_params), else None
        self.muon = muon
        self.names = names  # id(parameter) -> its name in the model
        self.grad_sync = grad_sync  # the shared gradient reduction (a no-op on one rank)
        self.adam_every = adam_every
        # Adam parameter -> the sum of its gradients since Adam's last step (zeroed, not dropped, once
        # used: the numerics guard restores tensors in place). The sharded DistAdam fills its own dict
        # with its reduced slices (optim/adam.py); torch's AdamW has none, and this container fills one.
        self.pending: dict[torch.Tensor, torch.Tensor] = getattr(adam, "pending", {})
        self._adam_stashes = hasattr(adam, "stash_grads")  # DistAdam: keeps its pending slices itself

    def members(self) -> dict[str, torch.optim.Optimizer]:
        """The members present (`muon` is None with optim.kind="adamw")."""
        return {k: v for k, v in (("adam", self.adam), ("muon", self.muon)) if v is not None}

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.members().values())

    def adam_due(self, step: int) -> bool:
        """Whether Adam steps at optimizer step `step` (0-based): every adam_every-th step (record #39:
        the odd ones)."""
        return (step + 1) % self.adam_every == 0

    @torch.no_grad()
    def fold_tied_grads(self) -> tuple | None:
        """While tied: the embedding's gradient (reduced) joins the head's, and the embedding has none left
        to step on. Idempotent within a step. Returns the tied pair (None when untied)."""
        pair = self.tied()
        if pair is None:
            return None
        embed, head = pair
        if getattr(self.adam, "world_size", 1) > 1:  # DistAdam: its reduced slices, folded when first read
            self.adam.fold_grad(embed, head)
        else:  # one rank, or fsdp's reduced DTensor shards (same layout for both)
            with torch.no_grad():
                fold_local_grad(embed, head)
        return pair

    def begin_step(self, step: int) -> None:
        """Before step `step`'s first backward: with optim.adam_every > 1 a DistAdam that defers its reduction
        (optim/adam.py) holds its gradients' collectives when Adam is not due."""
        if self.adam_every > 1 and hasattr(self.adam, "begin_step"):
            self.adam.begin_step(self.adam_due(step))

    def step(self, step: int | None = None) -> None:
        """Step every member; with adam_every > 1, Adam only when `step` is due (else its gradients wait).
        A tied embedding takes the head's values after an Adam update (see the module's docstring)."""
        if self.adam_every > 1 and step is None:
            raise ValueError("optim.adam_every > 1: Optimizers.step needs the step number")
        tied = self.fold_tied_grads()
        self._step_members(step)
        if tied is not None and (self.adam_every == 1 or self.adam_due(step)):
            with torch.no_grad():
                tied[0].copy_(tied[1])  # every rank holds the whole updated head (after DistAdam's all-gather)

    def _step_members(self, step: int | None) -> None:
        if self.adam_every == 1:
            for opt in self:
                opt.step()
            return
        if self.adam_due(step):
            if not self._adam_stashes:  # DistAdam adds its pending slices itself
                self._add_pending_to_grads()
            self.adam.step()
        elif self._adam_stashes:
            self.adam.stash_grads()
        else:
            self._stash_grads()
        if self.muon is not None:
            self.muon.step()

    @torch.no_grad()
    def _stash_grads(self) -> None:
        for p in self._params(self.adam):
            if p.grad is not None:
                add_pending(self.pending, p, p.grad)

    @torch.no_grad()
    def _add_pending_to_grads(self) -> None:
        for p, g in self.pending.items():
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.add_(g)
            g.zero_()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    @staticmethod
    def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
        """The member's parameters in torch's state_dict order (group by group)."""
        return [p for group in opt.param_groups for p in group["params"]]

    def state_dict(self, gather: bool = True) -> dict:
        """{"adam": {name: state}, "muon": {name: state}}, full. A collective on several ranks.
        gather=False leaves FSDP's DTensor shards as they are (for DCP, which saves shards)."""
        out = {}
        for key, opt in self.members().items():
            params = self._params(opt)
            out[key] = {self.names[id(params[int(i)])]: _gathered(st) if gather else st
                        for i, st in opt.state_dict()["state"].items()}
        if self.adam_every > 1:
            out["adam_pending"] = self._pending_state(gather)
        return out

    def _pending_state(self, gather: bool) -> dict:
        """{name: {"grad": full tensor}}; a collective when sharded (same parameters, same order on every rank)."""
        out = {}
        sharded = self._adam_stashes and self.adam.world_size > 1
        tied = self.tied()  # the same on every rank
        for p in self._params(self.adam):
            if tied is not None and p is tied[0]:
                continue  # tied, the embedding's gradient waits in the head's sum: it has none of its own
            if sharded:
                full = self.adam.waiting_sum(p)  # its reduced slices gathered, or its local sums reduced
            elif p in self.pending:
                g = self.pending[p]
                full = _gathered({"grad": g})["grad"] if gather else g
            else:
                full = None
            if full is not None:
                out[self.names[id(p)]] = {"grad": full}
        return out

    def _load_pending(self, saved: dict) -> None:
        self.pending.clear()
        by_name = {self.names[id(p)]: p for p in self._params(self.adam)}
        unknown = sorted(set(saved) - set(by_name))
        if unknown:
            raise KeyError(f"pending Adam gradients for parameters this model's Adam does not have: {', '.join(unknown[:3])}")
        if self._adam_stashes and self.adam.world_size > 1:  # DistAdam: its slices, or the whole sums set aside
            self.adam.load_waiting_sum({by_name[name]: st["grad"] for name, st in saved.items()})
            return
        from ..parallel.dtensor import is_sharded

        for name, st in saved.items():  # a whole tensor, or this rank's DTensor shard of it (fsdp)
            p, g = by_name[name], st["grad"]
            self.pending[p] = (_sharded_like({"grad": g}, p)["grad"] if is_sharded(p) else g.to(p.device)).clone()

    def load_state_dict(self, state: dict) -> None:
        """Load what `state_dict` wrote (from any world size). Each member keeps its own settings:
        only the per-parameter state is taken from the checkpoint."""
        if isinstance(state, (list, tuple)):
            state = self._from_positional(state)
        for key, opt in self.members().items():
            params = self._params(opt)
            index = {self.names[id(p)]: i for i, p in enumerate(params)}
            if key not in state:
                raise KeyError(f"the checkpoint has no '{key}' optimizer state; it was written with another "
                               f"optim.kind (members saved: {', '.join(state)})")
            saved = state[key]
            unknown = sorted(set(saved) - set(index))
            if unknown:
                raise KeyError(f"optimizer state for parameters this model does not have: {', '.join(unknown[:3])}")
            groups, start = [], 0
            for group in opt.param_groups:  # this optimizer's own settings, as torch's format wants them
                n = len(group["params"])
                groups.append({**{k: v for k, v in group.items() if k != "params"},
                               "params": list(range(start, start + n))})
                start += n
            states = {index[name]: _sharded_like(st, params[index[name]]) for name, st in saved.items()}
            opt.load_state_dict({"state": states, "param_groups": groups})
        if self.adam_every > 1 or state.get("adam_pending"):
            if self.adam_every == 1:
                raise KeyError("the checkpoint holds Adam gradients waiting for an Adam step (written with "
                               "optim.adam_every > 1); resume it with the same optim.adam_every")
            self._load_pending(state.get("adam_pending", {}))

    def _from_positional(self, states) -> dict:
        """Checkpoints written before this container: [adam, muon] torch state dicts, state by position."""
        out = {}
        for (key, opt), sd in zip(self.members().items(), states):
            params = self._params(opt)
            out[key] = {self.names[id(params[int(i)])]: st for i, st in sd["state"].items()}
        return out


def _gathered(state: dict) -> dict:
    """A parameter's optimizer state with FSDP's DTensor shards gathered whole (a collective on every
    rank, in the same order everywhere), so the checkpoint format is the same for every strategy."""
    from ..parallel.dtensor import full_tensor

    return {k: full_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _sharded_like(state: dict, param: torch.Tensor) -> dict:
    """The reverse for a sharded parameter: full state tensors of its shape become its shards."""
    from ..parallel.dtensor import is_sharded, shard_like

    if not is_sharded(param):
        return state
    return {k: shard_like(v, param) if isinstance(v, torch.Tensor) and not is_sharded(v) and v.shape == param.shape
            else v for k, v in state.items()}
