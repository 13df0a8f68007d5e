"""The compile helpers' program (train/compile_ahead.py starts one as `python -m speedgpt.train.compile_helper PART
CONFIG TRAINER_PID`): the run's trainer set up from its resolved config, then the work that compiles PART into the
run's compile cache. A module of its own, so that the trainer's module does not import it back."""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ..config.files import load_toml
from .compile_ahead import KEYS, PARTS, end_with_the_trainer
from .loop import Trainer
from .warmup import warmup_steps


class ForwardNotCompiled(Exception):
    """Raised by the backward helper's stand-in for the forward's compiled code, the first time it is called."""


def compile_validation(trainer: Trainer) -> str:
    """The validation warmup: one batch of each validation shape, compiled and run."""
    t0 = time.perf_counter()
    trainer.evaluate(warmup=True)
    return f"validation compiled and run once in {time.perf_counter() - t0:.1f}s"


def compile_backward(trainer: Trainer) -> str:
    """The warmup's first step, traced and partitioned into forward and backward as the trainer's is, with
    Inductor's compile of the forward skipped and the backward's done at once: AOTAutograd otherwise compiles the
    backward at the first backward call, after the forward's compile and run. The backward's Inductor key is its
    graph and inputs, so the trainer's lazy backward compile finds it in the cache. Nothing of this process's
    forward reaches a cache: AOTAutograd's cache (which keeps forward and backward together) is off here, and dynamo's
    package (train.compile_precompile) is only written by the trainer's warmup."""
    import torch
    import torch._inductor.compile_fx as compile_fx

    inductor_compile = compile_fx._compile_fx_inner  # what compile_fx_inner calls for each graph (torch 2.11, 2.13)

    def backward_only(gm, example_inputs, **kwargs):
        if kwargs.get("is_backward"):
            return inductor_compile(gm, example_inputs, **kwargs)

        def forward_not_compiled(*args, **kw):
            raise ForwardNotCompiled

        return forward_not_compiled

    compile_fx._compile_fx_inner = backward_only
    torch._functorch.config.force_non_lazy_backward_lowering = True
    torch._functorch.config.enable_autograd_cache = False
    t0 = time.perf_counter()
    try:
        trainer.train_step(warmup_steps(trainer.cfg, trainer.plan)[0])
    except ForwardNotCompiled:
        return f"training's backward graph compiled in {time.perf_counter() - t0:.1f}s"
    raise RuntimeError("the first step ran without a forward compile here: nothing compiled ahead")


def compile_ahead(part: str, config_file: Path, trainer_pid: int) -> None:
    """The helper's work: the run's trainer set up as the run sets it up, then `part`'s compile, in a run folder of
    its own that is then deleted."""
    end_with_the_trainer(trainer_pid)
    cfg = load_toml(config_file)
    config_file.unlink(missing_ok=True)  # read: the trainer's copy goes even where the trainer cannot remove it
    # no helpers of its own, and no second TensorBoard or W&B run (none of these keys changes what is compiled)
    cfg = replace(cfg, train=replace(cfg.train, **{key: "off" for key in KEYS.values()}),
                  run=replace(cfg.run, tensorboard=False, wandb=False))
    with tempfile.TemporaryDirectory(prefix=f"speedgpt-{part}-ahead-") as folder:
        trainer = Trainer(cfg, run_dir=Path(folder) / "run", quiet=True)
        trainer.save = lambda *args, **kwargs: None  # no step-0 checkpoint (train.on_nonfinite=rollback)
        trainer.setup()
        work = compile_backward if part == "backward" else compile_validation
        print(work(trainer), flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in PARTS:
        sys.exit(f"usage: python -m speedgpt.train.compile_helper {{{','.join(PARTS)}}} CONFIG TRAINER_PID")
    compile_ahead(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
