"""Fault-injection suite: real `speedgpt train` processes, faulted, then resumed, on CPU.

Every trial runs the CLI in a subprocess with a tiny config (seconds per run) and compares the
final weights and optimizer state with an uninterrupted run, bit for bit. Faults:

* kill9     SIGKILL at a random moment of the training phase, then `--auto-resume`.
* sigterm   SIGTERM at a random moment: expect a checkpoint within one step, exit 143, the
            resume line; then `--resume`.
* nan       an injected NaN at a random step under each of on_nonfinite = abort, skip, rollback.
* shard     a shard truncated after startup (stop: a named error) and before it (skip: killed
            and resumed, compared with an uninterrupted skipping run).
* save      a checkpoint write failing (as on a full disk) at a random checkpoint step.
* worker    rank 1 of a 2-process gloo run exits mid-run under `torchrun --max-restarts=1`.

`python scripts/fault_suite.py --trials 100 --faults kill9` is the measurement in
docs/reliability.md; tests/test_fault_suite.py runs a few trials of each.

The worker fault also runs on GPUs with a real preset (`--faults worker --nproc 4 --backend nccl
--preset speedrun-124m --steps 40 --data.train_files=...`): there it compares the final weights and
losses with an uninterrupted run of the same command and says whether they are bit-equal, and if
not, by how much they differ (GPU kernels need not be deterministic).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..argv import Parser
from .fault_runs import (BATCH_TOKENS, CHECKPOINT_EVERY, FAULTS, SIGNALLED, STEPS, ReferenceRunFailed, Runs,
                         Tally, flatten_state, check_runs, final_losses, make_data, replay_and_drift)
from .processes import last_line, run_env, speedgpt_command


def truncate_atomically(path: Path, n_bytes: int) -> None:
    """Cut the file to its first n_bytes in one rename: a run reading it meanwhile sees the whole file or the cut
    one, never the empty file that truncating in place shows for an instant (a loader thread once read it there,
    "at byte 0", and failed the suite's check of the named offset)."""
    cut = path.with_name(path.name + ".cut")
    cut.write_bytes(path.read_bytes()[:n_bytes])
    os.replace(cut, path)


class Suite:
    def __init__(self, workdir: Path, seed: int = 0, log=print, runs: Runs = Runs()):
        self.work = Path(workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.log = log
        self.runs = runs
        self.data = self.work / "data"
        if runs.preset is None and not (self.data / "val_000000.bin").exists():
            self.data.mkdir(exist_ok=True)
            make_data(self.data)
        self.env = run_env()
        self._n = 0
        self._refs: dict[str, tuple[dict, float, float]] = {}
        self._ref_dirs: dict[str, Path] = {}

    # -- running ---------------------------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        self._n += 1
        return self.work / f"{self._n:04d}-{name}"

    def epochs_steps(self, epochs: int) -> int:
        """Steps of the suite's config that read its training shards `epochs` times over."""
        from ..data.shards import read_header

        tokens = sum(read_header(f) for f in self.data.glob("train_*.bin"))
        return -(-epochs * tokens // BATCH_TOKENS)

    def _args(self, run_dir: Path, data: Path | None = None, extra=(), resume: str = "auto") -> list[str]:
        cmd = ["train", *self.runs.config()]
        if self.runs.preset is None:  # the suite's own shards
            data = data or self.data
            cmd += [f"--data.train_files={data}/train_*.bin", f"--data.val_files={data}/val_*.bin"]
        cmd += extra
        if resume == "auto":
            return [*cmd, "--run-dir", str(run_dir), "--auto-resume"]
        return [*cmd, "--resume", str(run_dir)]

    def start(self, args: list[str], inject: str = "", torchrun: bool = False) -> subprocess.Popen:
        env = {**self.env, "SPEEDGPT_INJECT": inject}
        cmd = speedgpt_command(args, self.runs.nproc, max_restarts=1) if torchrun else speedgpt_command(args)
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

    def run(self, args, inject: str = "", torchrun: bool = False) -> tuple[int, str]:
        p = self.start(args, inject, torchrun)
        out, _ = p.communicate(timeout=900)
        return p.returncode, out

    def run_until(self, args, when: float, sig: int, ready: str = "model:") -> tuple[int, str, bool, float]:
        """Start a run, send `sig` `when` seconds after its `ready` line (setup done), collect it.
        Returns (rc, output, whether the signal was sent before it ended, seconds from signal to exit)."""
        import threading

        p = self.start(args)
        lines: list[str] = []
        is_ready = threading.Event()

        def read() -> None:
            for line in p.stdout:
                lines.append(line)
                if ready in line:
                    is_ready.set()
            is_ready.set()  # ended (or failed) before the ready line

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        is_ready.wait()
        sent, t_sig = False, 0.0
        if p.poll() is None:
            time.sleep(when)
            if p.poll() is None:
                p.send_signal(sig)
                sent, t_sig = True, time.monotonic()
        p.wait()
        exit_s = time.monotonic() - t_sig if sent else 0.0
        reader.join()
        return p.returncode, "".join(lines), sent, exit_s

    # -- results ---------------------------------------------------------------------------------
    def final_state(self, run_dir: Path) -> dict | None:
        import torch

        from ..rundir.checkpoint import list_checkpoints, load_checkpoint

        found = list_checkpoints(run_dir / "checkpoints")
        if not found or not found[-1].name.endswith(f"{self.runs.steps:06d}"):
            return None
        model, optim, _ = load_checkpoint(found[-1])
        flat = {f"model.{k}": v for k, v in model.items()}
        flat.update({f"optim.{k}": v for k, v in flatten_state(optim).items() if isinstance(v, torch.Tensor)})
        return flat

    @staticmethod
    def equal(a: dict | None, b: dict | None) -> bool:
        import torch

        return a is not None and b is not None and a.keys() == b.keys() and all(
            torch.equal(a[k], b[k]) for k in a)

    def reference(self, name: str = "plain", data: Path | None = None, torchrun: bool = False, extra=()):
        """(final state, seconds from ready line to end, total seconds) of an uninterrupted run."""
        if name not in self._refs:
            d = self._dir(f"ref-{name}")
            t0 = time.monotonic()
            p = self.start(self._args(d, data, extra), torchrun=torchrun)
            out, t_ready = "", None
            for line in p.stdout:
                out += line
                if t_ready is None and "model:" in line:
                    t_ready = time.monotonic()
            p.wait()
            if p.returncode != 0:
                log = d.parent / f"{d.name}.log"
                log.write_text(out)
                raise ReferenceRunFailed(f"the uninterrupted reference run ({name}) failed with exit status "
                                         f"{p.returncode}: {last_line(out)} (whole output in {log})")
            end = time.monotonic()
            self._refs[name] = (self.final_state(d), end - (t_ready or t0), end - t0)
            self._ref_dirs[name] = d
        return self._refs[name]

    # -- faults ----------------------------------------------------------------------------------
    def kill9(self, trials: int, tally: Tally, data: Path | None = None, ref: str = "plain", extra=()) -> Tally:
        from ..rundir.checkpoint import TMP_PREFIX, list_checkpoints

        want, train_s, _ = self.reference(ref, data, extra=extra)
        for _ in range(trials):
            d = self._dir("kill9")
            rc, _, _, _ = self.run_until(self._args(d, data, extra), self.rng.uniform(0, train_s), signal.SIGKILL)
            newest = list_checkpoints(d / "checkpoints")
            newest_step = int(newest[-1].name[5:]) if newest else 0
            half = any(p.name.startswith(TMP_PREFIX) for p in (d / "checkpoints").glob("*"))
            rc2, out = self.run(self._args(d, data, extra))
            m = re.search(r"resumed from \S+ at step (\d+)", out)
            resumed = int(m.group(1)) if m else 0
            # A run that reached its last step before the kill (a loaded machine runs slower or faster
            # than the reference run timed): the resume finds it complete, and nothing is lost.
            complete = re.search(r" is complete \(step \d+ of \d+\)", out) is not None
            tally.trials += 1
            ok = self.equal(self.final_state(d), want)
            lost = resumed < newest_step and not complete
            tally.data_lost += lost
            if rc == 0:  # finished before the kill landed: nothing was tested, so it is no survival
                tally.not_killed += rc2 == 0 and ok  # else a failure: a finished run that did not stay equal
                tally.notes.append("finished before the kill")
            else:
                tally.survived += rc2 == 0
                tally.bit_equal += ok
                if half:
                    tally.notes.append("killed mid-save (temporary directory left, ignored)")
            if rc2 != 0 or not ok or lost:
                tally.notes.append(f"{d.name}: rc {rc2}, bit-equal {ok}, resumed at {resumed}, newest {newest_step}: "
                                   f"{last_line(out)}")
        return tally

    def sigterm(self, trials: int, tally: Tally) -> Tally:
        want, train_s, _ = self.reference()
        for _ in range(trials):
            d = self._dir("sigterm")
            rc, out, sent, exit_s = self.run_until(self._args(d), self.rng.uniform(0, train_s), signal.SIGTERM)
            m = re.search(r"stopped by SIGTERM at step (\d+) \((\d+) step\(s\) after the signal\)", out)
            tally.trials += 1
            if rc == 0:  # finished before the signal landed: nothing was tested, so it is no survival
                ok = self.equal(self.final_state(d), want)
                tally.not_killed += ok  # else a failure: the run, never signalled, differs from the reference
                tally.notes.append("finished before the signal" + ("" if ok else f" ({d.name}: not bit-equal)"))
                continue
            if not (m and rc == 128 + signal.SIGTERM and "resume with: speedgpt train --resume" in out):
                tally.notes.append(f"{d.name}: rc {rc}, no stop line: {out.strip().splitlines()[-1:]}")
            else:
                tally.notes.append(f"checkpoint {int(m.group(2))} step(s) after the signal, exit {exit_s:.2f}s "
                                   f"after it")
                if int(m.group(2)) > 1:
                    tally.data_lost += 1
                rc, out = self.run(self._args(d, resume="resume"))
            tally.survived += rc == 0
            ok = self.equal(self.final_state(d), want)
            tally.bit_equal += ok
        return tally

    def nan(self, trials: int, tally: Tally) -> Tally:
        import torch

        from ..rundir.checkpoint import list_checkpoints, load_checkpoint

        for i in range(trials):
            mode = ("abort", "skip", "rollback")[i % 3]
            step = self.rng.randrange(3, STEPS - 1)
            d = self._dir(f"nan-{mode}")
            rc, out = self.run(self._args(d, extra=[f"--train.on_nonfinite={mode}"]), inject=f"nan@{step}")
            tally.trials += 1
            ckpts = list_checkpoints(d / "checkpoints")
            finite = bool(ckpts) and all(torch.isfinite(v).all() for v in load_checkpoint(ckpts[-1])[0].values())
            if mode == "abort":
                ok = rc == 3 and f"at step {step + 1} (rank 0)" in out and "last good checkpoint" in out
            else:
                ok = rc == 0 and self.final_state(d) is not None
            tally.survived += ok
            tally.data_lost += not finite
            tally.notes.append(f"{mode} at step {step + 1}: rc {rc}, {'as expected' if ok else out[-300:]}")
        return tally

    def shard(self, trials: int, tally: Tally) -> Tally:
        import shutil

        for i in range(trials):
            tally.trials += 1
            if i % 2 == 0:  # stop: a shard that breaks after startup is a named error
                data = self._dir("shard-stop-data")
                shutil.copytree(self.data, data)
                bad = data / "train_000002.bin"
                d = self._dir("shard-stop")
                # The cut lands when this process reads "model:", and the run may have read the shard by then (a
                # busy machine). So the run goes on into further epochs, which read it again from disk (the loader
                # keeps 3 shards): whenever the cut lands, a later read meets it.
                p = self.start(self._args(d, data, extra=[f"--train.steps={self.epochs_steps(3)}"]))
                out = ""
                for line in p.stdout:
                    out += line
                    if "model:" in line:
                        truncate_atomically(bad, 1500)
                p.wait()
                ok = p.returncode == 2 and f"bad training shard {bad} at byte 1500" in out
                tally.survived += ok
                tally.notes.append(f"stop: rc {p.returncode}, {'named file and offset' if ok else out[-300:]}")
            else:  # skip: killed and resumed, equal to an uninterrupted skipping run
                data = self.work / "data-bad"
                if not data.exists():
                    shutil.copytree(self.data, data)
                    truncate_atomically(data / "train_000003.bin", 1500)
                sub = Tally()
                self.kill9(1, sub, data=data, ref="bad", extra=["--data.on_bad_shard=skip"])
                tally.survived += sub.survived
                tally.bit_equal += sub.bit_equal
                tally.data_lost += sub.data_lost
                tally.not_killed += sub.not_killed
                tally.notes.append("skip + kill -9 + resume: " + ("finished before the kill" if sub.not_killed
                                                                  else f"bit-equal {bool(sub.bit_equal)}"))
        return tally

    def save(self, trials: int, tally: Tally) -> Tally:
        want, _, _ = self.reference()
        for _ in range(trials):
            step = self.rng.randrange(2, STEPS // 2) * 2  # a checkpoint step after the first, before the last
            d = self._dir("save")
            rc, out = self.run(self._args(d), inject=f"save_error@{step}")
            tally.trials += 1
            said = f"could not write checkpoint step {step}" in out and "is intact" in out
            tally.survived += rc == 0 and said
            tally.bit_equal += self.equal(self.final_state(d), want)
        return tally

    def worker(self, trials: int, tally: Tally) -> Tally:
        ref = f"torchrun{self.runs.nproc}"
        want, _, _ = self.reference(ref, torchrun=True)
        ref_losses = final_losses(self._ref_dirs[ref], self.runs.steps)
        for _ in range(trials):
            # After the first checkpoint, before the last step: the group must resume mid-run.
            step = self.rng.randrange(self.runs.checkpoint_every + 1, self.runs.steps - 1)
            d = self._dir("worker")
            rc, out = self.run(self._args(d), inject=f"exit@{step}:1", torchrun=True)
            (d.parent / f"{d.name}.log").write_text(out)
            m = re.search(r"resumed from \S+ at step (\d+)", out)
            tally.trials += 1
            tally.survived += rc == 0 and m is not None
            got = self.final_state(d)
            ok = self.equal(got, want)
            tally.bit_equal += ok
            tally.notes.append(f"worker fault on {self.runs.describe()}: rank 1 exited at step {step + 1}; group "
                               f"restarted, resumed at step {m.group(1) if m else '?'}, rc {rc}; "
                               + compare_runs(got, want, final_losses(d, self.runs.steps), ref_losses)
                               + "; " + replay_and_drift(d, self._ref_dirs[ref]))
        return tally



def compare_runs(got: dict | None, want: dict | None, losses: dict, want_losses: dict) -> str:
    """One clause: the final weights bit-equal or their largest difference, and the final losses
    against the uninterrupted run's."""
    import torch

    if got is None or want is None:
        weights = "no final checkpoint to compare"
    elif Suite.equal(got, want):
        weights = "weights and optimizer state bit-equal to the uninterrupted run"
    else:
        model = [k for k in want if k.startswith("model.") and k in got]
        diffs = {k: (got[k].double() - want[k].double()).abs().max().item() for k in model
                 if got[k].shape == want[k].shape}
        worst = max(diffs, key=diffs.get) if diffs else None
        weights = ("weights differ from the uninterrupted run: max |diff| "
                   + (f"{diffs[worst]:.3g} (in {worst.removeprefix('model.')})" if worst else "n/a"))
    parts = [weights]
    for key in ("train_loss", "val_loss"):
        if key in losses and key in want_losses:
            a, b = losses[key], want_losses[key]
            parts.append(f"final {key.replace('_', ' ')} {a:.6f} vs {b:.6f} ({a - b:+.2e})")
    return "; ".join(parts)



def main(argv: list[str] | None = None) -> int:
    p = Parser(description="Fault-injection suite: faulted `speedgpt train` runs, resumed, "
                           "compared bit for bit with an uninterrupted run (CPU; the worker fault "
                           "also on GPUs with a real preset). Arguments like --train.x=1 are config "
                           "overrides of the worker fault's runs.")
    p.add_argument("--trials", type=int, default=10, help="kill -9 trials (default 10)")
    p.add_argument("--each", type=int, default=2, help="trials of every other fault (default 2)")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma list of {', '.join(FAULTS)}")
    p.add_argument("--workdir", default="fault-suite", help="where runs are written (default ./fault-suite)")
    p.add_argument("--seed", type=int, default=0)
    worker = p.add_argument_group("worker fault only")
    worker.add_argument("--nproc", type=int, default=2, help="processes in the torchrun group (default 2)")
    worker.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                        help="gloo: CPU processes (default); nccl: one GPU per process")
    worker.add_argument("--preset", default=None,
                        help="a preset to run instead of the suite's tiny config (give its data with "
                             "--data.train_files=DIR)")
    worker.add_argument("--steps", type=int, default=STEPS, help=f"steps of each run (default {STEPS})")
    worker.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY,
                        help=f"steps between checkpoints (default {CHECKPOINT_EVERY})")
    args, overrides = p.parse_known_args(argv)
    chosen = [f for f in args.faults.split(",") if f]
    runs = Runs(nproc=args.nproc, device="cuda" if args.backend == "nccl" else "cpu", preset=args.preset,
                steps=args.steps, checkpoint_every=args.checkpoint_every, overrides=tuple(overrides))
    from ..outdir import OutDirError, make_out_dir

    try:
        error = check_args(args, chosen) or check_runs(runs, chosen)
        if not error:
            make_out_dir(args.workdir, "--workdir")
    except OutDirError as e:
        error = str(e)
    if error:  # one line and status 2, before any run
        print(f"fault_suite: error: {error}", file=sys.stderr)
        return 2
    suite = Suite(Path(args.workdir), seed=args.seed, runs=runs)
    results = {}
    t0 = time.monotonic()
    for name in chosen:
        n = args.trials if name == "kill9" else args.each
        try:
            tally = getattr(suite, name)(n, Tally())
        except ReferenceRunFailed as e:
            print(f"fault_suite: {e}", file=sys.stderr)
            return 1
        results[name] = tally
        print(tally.line(name, name in SIGNALLED), flush=True)
        if tally.trials and tally.not_killed == tally.trials:
            print(f"fault_suite: {name}: every trial finished before its kill or signal landed; nothing was tested "
                  f"(run it again in a new --workdir)", file=sys.stderr)
    print(f"({time.monotonic() - t0:.0f}s)")
    (Path(args.workdir) / "results.json").write_text(json.dumps(
        {k: v.__dict__ for k, v in results.items()}, indent=1))
    if "worker" in results:  # the summary: bit-equal, or how far from the uninterrupted run
        print("\n".join(results["worker"].notes))
    return 1 if any(t.failed() for t in results.values()) else 0


def check_args(args, chosen: list[str]) -> str | None:
    """Why the suite's own arguments cannot run (one line naming the fix), or None. A run that tests nothing
    must not print a clean summary and exit 0: no fault, no trials, or a --workdir holding an earlier
    suite's runs (its runs would only auto-resume to the end, no kill landing, and its results.json be
    overwritten)."""
    if not chosen:
        return f"no fault chosen: --faults takes a comma list of {', '.join(FAULTS)}"
    unknown = sorted(set(chosen) - set(FAULTS))
    if unknown:
        return f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}"
    if args.trials < 1:
        return f"--trials must be >= 1 (got {args.trials})"
    if args.each < 1:
        return f"--each must be >= 1 (got {args.each})"
    from ..outdir import OutDirError, check_new_or_empty_dir

    try:
        check_new_or_empty_dir(args.workdir, "--workdir", "the suite writes its runs there")
    except OutDirError as e:
        return str(e)
    return None

