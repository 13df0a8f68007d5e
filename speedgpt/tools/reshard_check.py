"""A DCP checkpoint written on W ranks, resumed on W/2 and on 1: do the next steps' losses match?

`python scripts/dcp_reshard_check.py --nproc 4 --backend nccl --preset dense-1b --steps 10 --more 5
--data.train_files=DIR` trains K + M steps on W ranks with `train.checkpoint_format=dcp` and a
checkpoint at step K, copies the run directory as it was at step K (checkpoints after K left out)
once for each smaller world size, resumes each copy with `speedgpt train --resume` on W/2 and on 1
rank (at once, on disjoint GPUs: W/2 + 1 <= W), and prints the M steps' training losses of all of
them side by side with the largest difference from the W-rank run. Every run is the real command (`torchrun ... -m speedgpt train`);
gloo on CPUs, NCCL on GPUs (one per rank). Arguments like --train.x=1 are config overrides of the
W-rank run; the resumed runs read its saved config.

The global batch is the same on every world size (more micro-steps per rank on fewer ranks), so
the losses differ only by the order of floating-point reductions: equal within fp32 rounding on
CPU (tests/test_reshard_check.py), within bf16 noise on GPUs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..argv import Parser
from .processes import last_line, run_env, speedgpt_command


class RunFailed(RuntimeError):
    """One of the check's runs did not finish; the message names its log."""


def world_sizes(nproc: int) -> list[int]:
    """The world sizes of the check: W, W/2 and 1, without repeats."""
    return sorted({nproc, nproc // 2, 1}, reverse=True)


def run_config(args, device: str) -> list[str]:
    """The W-rank run's arguments after `train`: the preset, the check's steps and checkpoints, then
    the user's overrides."""
    total = args.steps + args.more
    # Only step K's checkpoint is resumed: no final one (dense-1b's is 13 GB per run).
    return ["--preset", args.preset, f"--train.steps={total}", f"--train.checkpoint_every={args.steps}",
            "--train.checkpoint_format=dcp", "--train.keep_checkpoints=0", "--train.checkpoint_every_min=0",
            "--train.save_final_checkpoint=false",
            "--train.log_every=1", "--run.report=false", "--run.sample_tokens=0", f"--train.device={device}",
            *args.overrides]


def copy_at_step(run_dir: Path, dest: Path, step: int) -> Path:
    """A copy of run_dir as it was after its checkpoint of `step`: later checkpoints left out (its
    metrics stay; a resume marks the later records as abandoned, rundir/metrics.py). Checkpoint
    files are hard links where the file system allows (a resume only reads them, and dense-1b's
    are 13 GB); everything else, which the resumed run appends to, is copied."""
    from ..rundir.checkpoint import list_checkpoints

    checkpoints = run_dir / "checkpoints"
    later = {p.name for p in list_checkpoints(checkpoints) if int(p.name.split("_")[-1]) > step}

    def link_or_copy(src: str, dst: str) -> None:
        if Path(src).is_relative_to(checkpoints):
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copy2(src, dst)

    shutil.copytree(run_dir, dest, copy_function=link_or_copy,
                    ignore=lambda d, names: [n for n in names if n in later] if Path(d) == checkpoints else [])
    return dest


def step_losses(run_dir: Path, steps: range) -> list[float | None]:
    """The training loss a run logged after each of `steps` (None where it logged none)."""
    from ..rundir.metrics import read_metrics

    by_step = {r["step"]: r["train_loss"] for r in read_metrics(run_dir) if "train_loss" in r}
    return [by_step.get(s) for s in steps]


def loss_table(sizes: list[int], losses: dict[int, list[float | None]],
               steps: range) -> tuple[list[str], dict[int, float]]:
    """The printout (one row per step, a column per world size, then each smaller world size's
    largest |difference| from the first) and those largest differences by world size."""
    base, others = sizes[0], sizes[1:]
    header = f"{'step':>6}" + "".join(f"{f'{w} rank(s)':>14}" for w in sizes) + "".join(
        f"{f'|{w} - {base}|':>14}" for w in others)
    lines, worst = [header], {w: 0.0 for w in others}
    for i, step in enumerate(steps):
        row = [losses[w][i] for w in sizes]
        cells = "".join(f"{v:>14.6f}" if v is not None else f"{'-':>14}" for v in row)
        for w in others:
            a, b = losses[w][i], losses[base][i]
            diff = abs(a - b) if a is not None and b is not None else float("nan")
            worst[w] = max(worst[w], diff) if diff == diff else float("nan")
            cells += f"{diff:>14.2e}"
        lines.append(f"{step:>6}{cells}")
    return lines, worst


def start(cmd: list[str], log: Path, env: dict) -> tuple[subprocess.Popen, Path, float]:
    """Start `cmd` with its output in `log`."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), log, time.monotonic()


def finish(started: tuple[subprocess.Popen, Path, float]) -> float:
    """Wait for a started run; its seconds. Raises RunFailed naming its log."""
    proc, log, t0 = started
    rc = proc.wait()
    if rc != 0:
        cmd = proc.args
        raise RunFailed(f"{' '.join(cmd[cmd.index('speedgpt'):][:4])} ... exited with status {rc}: "
                        f"{last_line(log.read_text(errors='replace'))} (whole output in {log})")
    return time.monotonic() - t0


def gpu_sets(sizes: list[int], env: dict) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each of the resumed runs, on disjoint GPUs so they run at once
    (W/2 + 1 <= W): the GPUs visible here, in order."""
    import torch

    visible = env.get("CUDA_VISIBLE_DEVICES") or ",".join(str(i) for i in range(torch.cuda.device_count()))
    ids, sets, at = visible.split(","), [], 0
    for w in sizes:
        sets.append(",".join(ids[at:at + w]))
        at += w
    return sets


def check(args, log=print) -> dict[int, float]:
    """Run the check; returns the largest loss difference from the W-rank run, by world size."""
    device = "cuda" if args.backend == "nccl" else "cpu"
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = run_env()
    sizes = world_sizes(args.nproc)
    first = work / f"ranks{sizes[0]}"
    cmd = speedgpt_command(["train", *run_config(args, device), "--run-dir", str(first)], args.nproc)
    secs = finish(start(cmd, work / f"ranks{sizes[0]}.log", env))
    log(f"{sizes[0]} rank(s): {args.steps + args.more} steps with a DCP checkpoint at step {args.steps} ({secs:.0f}s)")
    dirs, runs = {sizes[0]: first}, {}
    gpus = gpu_sets(sizes[1:], env) if device == "cuda" else [None] * len(sizes[1:])
    for w, visible in zip(sizes[1:], gpus):  # the resumed runs at once, each on its own GPUs
        dirs[w] = copy_at_step(first, work / f"ranks{w}", args.steps)
        # One rank needs no torchrun (no process group either way).
        cmd = speedgpt_command(["train", "--resume", str(dirs[w])], w if w > 1 else 0)
        runs[w] = start(cmd, work / f"ranks{w}.log", env if visible is None else {**env, "CUDA_VISIBLE_DEVICES": visible})
    try:
        for w, started in runs.items():
            log(f"{w} rank(s): resumed at step {args.steps}, {args.more} more steps ({finish(started):.0f}s)")
    except RunFailed:
        for proc, _, _ in runs.values():  # none is left running after the check has failed
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        raise
    steps = range(args.steps + 1, args.steps + args.more + 1)
    losses = {w: step_losses(d, steps) for w, d in dirs.items()}
    lines, worst = loss_table(sizes, losses, steps)
    log(f"training loss after each step (run dirs in {work}):")
    log("\n".join(lines))
    log(f"largest |loss difference| from the {sizes[0]}-rank run: "
        + ", ".join(f"{w} rank(s) {d:.3g}" for w, d in worst.items()))
    return worst


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0],
               epilog="Arguments like --train.x=1 are config overrides of the first run.")
    p.add_argument("--nproc", type=int, default=2, help="ranks of the first run, W (default 2; >= 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="gloo: CPU processes (default); nccl: one GPU per rank")
    p.add_argument("--preset", default="tiny-cpu", help="the preset to train (default tiny-cpu)")
    p.add_argument("--steps", type=int, default=4, help="steps before the checkpoint, K (default 4)")
    p.add_argument("--more", type=int, default=3, help="steps after it, compared, M (default 3)")
    p.add_argument("--workdir", default="dcp-reshard-check", help="where the runs are written")
    args, args.overrides = p.parse_known_args(argv)
    error = check_args(args)
    if error:
        p.error(error)
    try:
        check(args)
    except RunFailed as e:
        print(f"dcp_reshard_check: {e}", file=sys.stderr)
        return 1
    return 0


def check_args(args) -> str | None:
    """Why these arguments cannot run (one line naming the fix), or None."""
    if args.nproc < 2:
        return f"--nproc {args.nproc}: the checkpoint must be written on at least 2 ranks to be resharded"
    if args.steps < 1 or args.more < 1:
        return f"--steps {args.steps} --more {args.more}: both must be >= 1"
    from ..outdir import OutDirError, check_new_or_empty_dir

    try:
        check_new_or_empty_dir(args.workdir, "--workdir", "the check writes its runs there")
    except OutDirError as e:
        return str(e)
    if args.backend == "nccl":
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if visible < args.nproc:
            return f"--backend nccl --nproc {args.nproc} needs {args.nproc} GPUs, {visible} visible; run it where " \
                   f"there are {args.nproc}, or lower --nproc"
    from ..config import ConfigError, resolve
    from ..planner import plan_run

    try:  # a mistyped override, or a batch some world size cannot share, fails here (as the run's start would)
        cfg = resolve(args.preset, None, run_config(args, "cpu")[2:])
        for w in world_sizes(args.nproc):
            plan_run(cfg, w)
    except ConfigError as e:
        return f"config error: {e}"
    return None
