"""The validation helper's program (train/validation_ahead.py starts it as `python -m speedgpt.train.validation_helper
CONFIG TRAINER_PID`): the run's trainer set up from its resolved config, then its validation warmup, which compiles
validation's graph into the run's compile cache. A module of its own, so that the trainer's module does not import it
back."""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ..config.files import load_toml
from .loop import Trainer
from .validation_ahead import end_with_the_trainer


def compile_validation(config_file: Path, trainer_pid: int) -> None:
    """The helper's work: the run's trainer set up as the run sets it up, then its validation warmup (one batch of
    each validation shape, compiled and run), in a run folder of its own that is then deleted."""
    end_with_the_trainer(trainer_pid)
    cfg = load_toml(config_file)
    config_file.unlink(missing_ok=True)  # read: the trainer's copy goes even where the trainer cannot remove it
    # no helper of its own, and no second TensorBoard or W&B run (neither key changes what is compiled)
    cfg = replace(cfg, train=replace(cfg.train, compile_validation_ahead="off"),
                  run=replace(cfg.run, tensorboard=False, wandb=False))
    with tempfile.TemporaryDirectory(prefix="speedgpt-validation-ahead-") as folder:
        t0 = time.perf_counter()
        trainer = Trainer(cfg, run_dir=Path(folder) / "run", quiet=True)
        trainer.save = lambda *args, **kwargs: None  # no step-0 checkpoint (train.on_nonfinite=rollback)
        trainer.setup()
        # the trainer's line says when the helper was done: less these two, its interpreter's start and imports
        t1 = time.perf_counter()
        print(f"trainer set up in {t1 - t0:.1f}s", flush=True)
        trainer.evaluate(warmup=True)
        print(f"validation compiled and run once in {time.perf_counter() - t1:.1f}s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():  # started by validation_ahead.py, not by hand
        sys.exit("usage: python -m speedgpt.train.validation_helper CONFIG TRAINER_PID (the trainer starts it)")
    compile_validation(Path(sys.argv[1]), int(sys.argv[2]))
