"""What the run does once the numerics guard (guard.py) reports a non-finite loss or gradient on a
check step: under train.on_nonfinite=rollback, while rollbacks are left and a checkpoint exists,
reload the newest checkpoint and go on with lower learning rates; otherwise stop with an error
naming the step, the rank, the last good checkpoint and the fix."""

from __future__ import annotations

from collections.abc import Callable
from ..config import TrainConfig
from ..rundir import RunDir
from .guard import NonFiniteError


class Rollbacks:
    """The rollbacks used so far and the learning-rate scale they left (`lr_scale`, part of the
    checkpointed state: a resumed run keeps the lowered rates)."""

    def __init__(self, t: TrainConfig):
        self.t = t
        self.used = 0
        self.lr_scale = 1.0

    def respond(self, bad_by_rank: dict[int, int], rundir: RunDir, reload: Callable[[], int], log, metrics) -> bool:
        """Act on the guard's findings (rank -> first bad step; empty: all finite). Returns True after
        a rollback, which `reload` performs (it loads the newest checkpoint and returns its step);
        False when all was finite. Raises NonFiniteError when there is nothing to roll back to."""
        if not bad_by_rank:
            return False
        rank, step = min(bad_by_rank.items(), key=lambda kv: (kv[1], kv[0]))
        found = rundir.list_checkpoints()
        good = found[-1] if found else None
        t = self.t
        what = f"non-finite loss or gradient at step {step + 1} (rank {rank})"
        if t.on_nonfinite == "rollback" and good is not None and self.used < t.max_rollbacks:
            self.used += 1
            resumed_at = reload()
            self.lr_scale *= t.rollback_lr_factor
            log(f"{what}: rolled back to {good} (step {resumed_at}); learning rates x{self.lr_scale:g} "
                f"from here (rollback {self.used} of at most {t.max_rollbacks})")
            metrics.log({"event": "rollback", "step": resumed_at, "bad_step": step + 1, "rank": rank,
                         "lr_scale": self.lr_scale})
            return True
        if t.on_nonfinite == "rollback":
            why = "no checkpoint to roll back to" if good is None else f"{self.used} rollbacks used up"
            what += f" ({why})"
        last = f"the last good checkpoint is {good}" if good else "no checkpoint was written"
        metrics.close()
        raise NonFiniteError(f"{what}; {last}. Lower the learning rates (e.g. --optim.muon_lr), enable "
                             f"--optim.grad_clip=1.0, or set --train.on_nonfinite=skip|rollback")
