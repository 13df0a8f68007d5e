"""The run's optimizers as one object: `adam` (embeddings, head, scalars) and `muon` (hidden matrices).

Each member is whichever implementation suits the world size (torch's AdamW and Muon on one rank,
the sharded DistAdam and DistMuon on several); the trainer, the checkpoints and gradient clipping
see only this container.

Checkpoint format (`state_dict`): per member, the per-parameter state (moments, momentum buffers,
step counts) keyed by parameter name, in full (unsharded) form. Hyperparameters are not in it:
they come from the config and the schedules, which the trainer applies every step, and each
implementation keeps its own settings (fused kernels, algorithm switches) across a load. So a
checkpoint moves between world sizes and implementations with nothing to repair.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class Optimizers:
    def __init__(self, adam: torch.optim.Optimizer, muon: torch.optim.Optimizer | None, names: dict[int, str],
                 grad_sync):
        self.adam = adam
        self.muon = muon
        self.names = names  # id(parameter) -> its name in the model
        self.grad_sync = grad_sync  # the shared gradient reduction (a no-op on one rank)

    def members(self) -> dict[str, torch.optim.Optimizer]:
        """The members present (`muon` is None with optim.kind="adamw")."""
        return {k: v for k, v in (("adam", self.adam), ("muon", self.muon)) if v is not None}

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.members().values())

    def step(self) -> None:
        for opt in self:
            opt.step()

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
        return out

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
    from ..parallel.fsdp import full_tensor

    return {k: full_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _sharded_like(state: dict, param: torch.Tensor) -> dict:
    """The reverse for a sharded parameter: full state tensors of its shape become its shards."""
    from ..parallel.fsdp import is_sharded, shard_like

    if not is_sharded(param):
        return state
    return {k: shard_like(v, param) if isinstance(v, torch.Tensor) and not is_sharded(v) and v.shape == param.shape
            else v for k, v in state.items()}
