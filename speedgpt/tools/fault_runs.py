"""The fault suite's runs and results: the tiny config its faulted runs use (or a real preset on N
GPUs), the tally of each fault, the small shards it trains on, the losses a run logged, and the
check that a requested set of runs can run at all (tools/fault_suite.py drives them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STEPS = 12
CHECKPOINT_EVERY = 2
BATCH_TOKENS = 256
# As small as the trainer allows while keeping GPT-2's vocabulary: a run is a few seconds of
# compute, and checkpoints every 2 steps make a kill during a save likely.
CONFIG = [
    "--model.depth=1", "--model.model_dim=32", "--model.head_dim=16", "--model.value_embeds=0",
    "--data.seq_len=64", f"--train.batch_tokens={BATCH_TOKENS}", f"--train.steps={STEPS}", "--train.log_every=4",
    "--train.val_every=0", "--data.val_tokens=256", "--train.device=cpu", "--run.report=false",
    "--run.sample_tokens=0", "--schedule.window_start=64", "--schedule.window_end=64",
    "--schedule.window_block=16", "--optim.muon_momentum_warmup_steps=5",
    f"--train.checkpoint_every={CHECKPOINT_EVERY}", "--train.keep_checkpoints=2", "--train.checkpoint_every_min=0",
]
FAULTS = ("kill9", "sigterm", "nan", "shard", "save", "worker")
SIGNALLED = ("kill9", "sigterm", "shard")  # faults whose trials may finish before their kill or signal lands


@dataclass(frozen=True)
class Runs:
    """How the suite's runs are made. The defaults are the tiny CPU config above; the worker fault
    also runs a real preset on N GPUs (`preset` set: its own config, these steps and checkpoints,
    a loss logged every step so the final losses compare, then `overrides`)."""

    nproc: int = 2  # processes of a torchrun group (the worker fault)
    device: str = "cpu"  # "cuda": NCCL between the processes, one GPU each
    preset: str | None = None  # None: tiny-cpu with CONFIG and the suite's own small shards
    steps: int = STEPS
    checkpoint_every: int = CHECKPOINT_EVERY
    overrides: tuple[str, ...] = ()

    def config(self) -> list[str]:
        if self.preset is None:
            fixed = {"--train.steps": str(self.steps), "--train.checkpoint_every": str(self.checkpoint_every),
                     "--train.device": self.device}
            own = []
            for item in CONFIG:
                key = item.split("=", 1)[0]
                own.append(f"{key}={fixed[key]}" if key in fixed else item)
            return ["--preset", "tiny-cpu", *own, *self.overrides]
        return ["--preset", self.preset, f"--train.steps={self.steps}",
                f"--train.checkpoint_every={self.checkpoint_every}", "--train.keep_checkpoints=2",
                "--train.checkpoint_every_min=0", "--train.log_every=1", "--run.report=false",
                "--run.sample_tokens=0", f"--train.device={self.device}", *self.overrides]

    def describe(self) -> str:
        backend = "nccl" if self.device == "cuda" else "gloo"
        return f"{self.nproc} x {backend}, {self.preset or 'tiny-cpu (suite config)'}, {self.steps} steps"



@dataclass
class Tally:
    trials: int = 0
    survived: int = 0
    bit_equal: int = 0
    data_lost: int = 0
    # Trials whose run finished before the kill or signal landed (a busy machine runs slower or faster than
    # the reference run timed): their resume found the run complete, so nothing was tested. They count in
    # `trials` but never in `survived` or `bit_equal`, and the summary line shows them.
    not_killed: int = 0
    notes: list[str] = field(default_factory=list)

    def failed(self) -> bool:
        """Data lost, a tested trial that did not survive, or nothing tested at all."""
        tested = self.trials - self.not_killed
        return bool(self.data_lost) or self.survived < tested or tested == 0

    def line(self, name: str, signalled: bool) -> str:
        """The summary line of fault `name`; `signalled`: its trials kill or signal a run (not killed shows)."""
        line = (f"{name:8s} trials {self.trials:3d} | survived {self.survived:3d} | bit-equal {self.bit_equal:3d} | "
                f"data lost {self.data_lost:3d}")
        return line + (f" | not killed {self.not_killed:3d}" if signalled else "")



def make_data(out: Path, shards: int = 8, shard_tokens: int = 600) -> Path:
    """Small train shards (so runs cross several) and a val shard, from this interpreter's stdlib."""
    import sysconfig

    from ..data.shards import write_shard
    from ..data.tokenizer import BOS_ID, get_tokenizer

    enc = get_tokenizer()
    need = shards * shard_tokens + 1200
    tokens: list[int] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        tokens.append(BOS_ID)
        tokens += enc.encode_ordinary(path.read_text(errors="replace"))
        if len(tokens) >= need:
            break
    arr = np.array(tokens[:need], dtype=np.uint16)
    for i in range(shards):
        write_shard(out / f"train_{i:06d}.bin", arr[i * shard_tokens:(i + 1) * shard_tokens])
    write_shard(out / "val_000000.bin", arr[shards * shard_tokens:])
    return out



class ReferenceRunFailed(RuntimeError):
    """The uninterrupted run a fault is compared with did not finish: nothing can be compared."""



def final_losses(run_dir: Path, step: int) -> dict[str, float]:
    """The train and val loss a run logged at `step` (after a resume: the resumed timeline's)."""
    from ..rundir.metrics import read_metrics

    out = {}
    try:
        records = read_metrics(run_dir)
    except FileNotFoundError:
        return out
    for r in records:
        if r["step"] == step:
            for key in ("train_loss", "val_loss"):
                if key in r:
                    out[key] = r[key]
    return out


def loss_timelines(run_dir: Path) -> tuple[dict[int, float], dict[int, float], int | None]:
    """The training losses a run logged before its first resume and after it, and the step it resumed at
    (None: never resumed). read_metrics keeps only the resumed timeline; the worker fault needs both."""
    from ..rundir.metrics import read_records

    before: dict[int, float] = {}
    after: dict[int, float] = {}
    resumed = None
    try:
        records = read_records(run_dir)
    except FileNotFoundError:
        records = []
    for rec in records:
        if resumed is None and rec.get("event") == "resume":
            resumed = rec["step"]
        elif "train_loss" in rec:
            (before if resumed is None else after)[rec["step"]] = rec["train_loss"]
    return before, after, resumed


def replay_and_drift(run_dir: Path, ref_dir: Path) -> str:
    """One clause on where a faulted run's difference from the uninterrupted run comes from: how far the steps
    replayed after the resume are from the run's own losses before the fault (the restart's error), and how far
    the run was from the uninterrupted one before the fault (the same command's run-to-run difference: GPU kernels
    need not be deterministic). Equal losses print as bit-equal."""
    before, after, resumed = loss_timelines(run_dir)
    ref = loss_timelines(ref_dir)[0]
    if resumed is None:
        return "no resume logged"

    def worst(a: dict[int, float], b: dict[int, float], steps) -> tuple[float, int | None]:
        diffs = [(abs(a[s] - b[s]), s) for s in steps if s in a and s in b]
        first = next((s for d, s in diffs if d > 0), None)
        return max((d for d, _ in diffs), default=0.0), first

    replayed = sorted(s for s in after if s in before)
    if replayed:
        d, _ = worst(after, before, replayed)
        replay = (f"steps {replayed[0]}-{replayed[-1]} replayed after the resume "
                  + ("bit-equal to" if d == 0 else f"within {d:.2g} of") + " the run's own losses before the fault")
    else:
        replay = "no step replayed (killed at a checkpoint)"
    d, first = worst(before, ref, sorted(before))
    drift = ("before the fault its losses were bit-equal to the uninterrupted run's" if d == 0 else
             f"before the fault its losses already differed from the uninterrupted run's by up to {d:.2g} "
             f"(from step {first} on: the same command's run-to-run difference)")
    return f"{replay}; {drift}"


def flatten_state(obj, prefix=""):
    """A nested state dict (an optimizer's) as one flat dict of dotted keys."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(flatten_state(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten_state(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): obj}



def check_runs(runs: Runs, chosen: list[str]) -> str | None:
    """Why `runs` cannot be run for the faults `chosen` (one line naming the fix), or None."""
    if runs != Runs() and chosen != ["worker"]:
        return ("--nproc, --backend, --preset, --steps, --checkpoint-every and config overrides apply to the "
                    "worker fault only; add --faults worker")
    if runs.nproc < 2:
        return f"--nproc {runs.nproc}: the worker fault needs at least 2 processes (rank 1 is the one that dies)"
    if runs.checkpoint_every < 1 or runs.steps < runs.checkpoint_every + 3:
        return (f"--steps {runs.steps} --checkpoint-every {runs.checkpoint_every}: a run needs a checkpoint, then "
                f"a step to fail in, then one more (steps >= checkpoint-every + 3, checkpoint-every >= 1)")
    if runs.device == "cuda":
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible < runs.nproc:
            return (f"--backend nccl --nproc {runs.nproc} needs {runs.nproc} GPUs, {visible} visible; run it where "
                    f"there are {runs.nproc}, or lower --nproc")
    from ..config import ConfigError, resolve
    from ..planner import plan_run

    try:  # a mistyped override or a batch the ranks cannot share fails here, as a run's start would (once)
        plan_run(resolve(runs.preset or "tiny-cpu", None, runs.config()[2:]), runs.nproc)
    except ConfigError as e:
        return f"config error: {e}"
    return None

