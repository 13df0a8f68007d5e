"""Running a plan: each run a `python -m speedgpt train` subprocess, in waves over the devices;
what is finished (skipped), failed (recorded in the run directory, reported) or half-done
(resumed from its checkpoint, or restarted)."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from ..atomic import atomic_write
from ..provenance import PACKAGE_DIR
from .plan import AbError, Plan, Run, waves

STATUS_FILE = "ab_status.json"  # written into a run dir when the run failed
LOG_FILE = "train.log"


def check_existing(run: Run) -> None:
    """A run directory left by an earlier `ab` must hold this plan's configuration."""
    from ..config import ConfigError
    from ..rundir.reuse import config_differences

    try:
        diff = config_differences(run.run_dir, run.config)
    except ConfigError as e:  # its config.toml unreadable or gone: not known to be this plan's run
        raise AbError(str(e)) from None
    if diff:
        raise AbError(f"{run.run_dir} holds a run of another configuration (differs in {', '.join(diff[:4])}); "
                      f"use a new --out or delete it")


def read_records(run_dir: Path) -> list[dict]:
    from ..rundir import RunDir

    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return RunDir(run_dir).read_metrics()
    except FileNotFoundError:
        return []


def is_finished(run: Run) -> bool:
    """Its final validation is logged: after all its steps, or where train.time_budget_s stopped it."""
    from ..rundir.metrics import ended_by

    return ended_by(read_records(run.run_dir), run.steps) is not None


def failure_of(run: Run) -> dict | None:
    path = run.run_dir / STATUS_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def train_command(run: Run) -> list[str]:
    """The subprocess: a fresh run, or a resume from the run's own checkpoint."""
    from ..rundir import RunDir

    rundir = RunDir(run.run_dir)
    if rundir.list_checkpoints() and rundir.is_run():
        return [sys.executable, "-m", "speedgpt", "train", "--resume", str(run.run_dir)]
    return [sys.executable, "-m", "speedgpt", "train", *run.argv]


def _classify(run: Run, returncode: int) -> dict:
    log = (run.run_dir / LOG_FILE).read_text(errors="replace") if (run.run_dir / LOG_FILE).is_file() else ""
    diverged = "FloatingPointError" in log or "loss became" in log or any(
        isinstance(r.get("val_loss"), float) and not math.isfinite(r["val_loss"]) for r in read_records(run.run_dir))
    last = [line for line in log.strip().splitlines() if line.strip()][-1:] or [""]
    if returncode == 0 and not diverged:
        # Exit 0, not finished: its metrics lack the final validation. A run stopped in its last step, or in the
        # step that spent its time budget, now resumes to that validation (train/resume.py); this guard stays so
        # that a run without it is never counted, whatever the path. Only a fresh run gives it then.
        return {"status": "crashed", "returncode": 0,
                "last_line": f"train exited 0 but the run's metrics hold no final validation; delete {run.run_dir} and "
                             f"run the same command again to train it afresh"}
    return {"status": "diverged" if diverged else "crashed", "returncode": returncode, "last_line": last[0][:300]}


def execute(plan: Plan, devices: list[str], concurrent: int, *, print_fn=print, retry_failed: bool = False,
            workdir: str | None = None) -> None:
    # Children start in `workdir` by its path, not in the inherited directory: if that directory was
    # replaced while `ab` ran (a re-synced checkout), an inherited, deleted cwd makes `import torch` abort
    # ("oneMKL FATAL ERROR: Cannot load libtorch_cpu.so"); seen on a GPU machine, 2026-11-24.
    workdir = workdir or os.getcwd()
    for run in plan.runs:
        check_existing(run)
    for wave in waves(plan.runs, devices, concurrent):
        procs = []
        for run, device in wave:
            fail = failure_of(run)
            if is_finished(run) or (fail and fail.get("status") == "diverged" and not retry_failed):
                continue
            cmd = train_command(run)
            if cmd[4] != "--resume" and run.run_dir.exists():
                shutil.rmtree(run.run_dir)  # a half-run without a checkpoint: start over
            run.run_dir.mkdir(parents=True, exist_ok=True)
            (run.run_dir / STATUS_FILE).unlink(missing_ok=True)
            env = dict(os.environ)
            # The children import this same speedgpt, wherever `ab` was started from.
            root = str(PACKAGE_DIR.parent)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
            if device != "cpu":
                env["CUDA_VISIBLE_DEVICES"] = device
            print_fn(f"ab: {run.arm.upper()} seed {run.seed} on {'GPU ' + device if device != 'cpu' else 'CPU'}: "
                     f"{shlex.join(cmd[1:])}")
            log = open(run.run_dir / LOG_FILE, "a")
            procs.append((run, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir), log))
        for run, proc, log in procs:
            rc = proc.wait()
            log.close()
            if rc != 0 or not is_finished(run):
                status = _classify(run, rc)
                atomic_write(run.run_dir / STATUS_FILE, json.dumps(status))
                print_fn(f"ab: {run.arm.upper()} seed {run.seed} {status['status']} (exit {rc}); see "
                         f"{run.run_dir / LOG_FILE}")
