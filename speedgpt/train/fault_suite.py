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
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STEPS = 12
# As small as the trainer allows while keeping GPT-2's vocabulary: a run is a few seconds of
# compute, and checkpoints every 2 steps make a kill during a save likely.
CONFIG = [
    "--model.depth=1", "--model.model_dim=32", "--model.head_dim=16", "--model.value_embeds=0",
    "--data.seq_len=64", "--train.batch_tokens=256", f"--train.steps={STEPS}", "--train.log_every=4",
    "--train.val_every=0", "--data.val_tokens=256", "--train.device=cpu", "--run.report=false",
    "--run.sample_tokens=0", "--schedule.window_start=64", "--schedule.window_end=64",
    "--schedule.window_block=16", "--optim.muon_momentum_warmup_steps=5", "--train.checkpoint_every=2",
    "--train.keep_checkpoints=2", "--train.checkpoint_every_min=0",
]
FAULTS = ("kill9", "sigterm", "nan", "shard", "save", "worker")


@dataclass
class Tally:
    trials: int = 0
    survived: int = 0
    bit_equal: int = 0
    data_lost: int = 0
    notes: list[str] = field(default_factory=list)


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


class Suite:
    def __init__(self, workdir: Path, seed: int = 0, log=print):
        self.work = Path(workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.log = log
        self.data = self.work / "data"
        if not (self.data / "val_000000.bin").exists():
            self.data.mkdir(exist_ok=True)
            make_data(self.data)
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                    "SPEEDGPT_INJECT": ""}
        self.env.pop("TORCHELASTIC_RESTART_COUNT", None)
        self._n = 0
        self._refs: dict[str, tuple[dict, float, float]] = {}

    # -- running ---------------------------------------------------------------------------------
    def _dir(self, name: str) -> Path:
        self._n += 1
        return self.work / f"{self._n:04d}-{name}"

    def _args(self, run_dir: Path, data: Path | None = None, extra=(), resume: str = "auto") -> list[str]:
        data = data or self.data
        cmd = ["train", "--preset", "tiny-cpu", *CONFIG, f"--data.train_files={data}/train_*.bin",
               f"--data.val_files={data}/val_*.bin", *extra]
        if resume == "auto":
            return [*cmd, "--run-dir", str(run_dir), "--auto-resume"]
        return [*cmd, "--resume", str(run_dir)]

    def start(self, args: list[str], inject: str = "", torchrun: bool = False) -> subprocess.Popen:
        env = {**self.env, "SPEEDGPT_INJECT": inject}
        if torchrun:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   "--max-restarts=1", "-m", "speedgpt", *args]
        else:
            cmd = [sys.executable, "-m", "speedgpt", *args]
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
    @staticmethod
    def final_state(run_dir: Path) -> dict | None:
        import torch

        from ..rundir.checkpoint import list_checkpoints, load_checkpoint

        found = list_checkpoints(run_dir / "checkpoints")
        if not found or not found[-1].name.endswith(f"{STEPS:06d}"):
            return None
        model, optim, _ = load_checkpoint(found[-1])
        flat = {f"model.{k}": v for k, v in model.items()}
        flat.update({f"optim.{k}": v for k, v in _flatten(optim).items() if isinstance(v, torch.Tensor)})
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
                raise RuntimeError(f"reference run {name} failed (rc {p.returncode}):\n{out[-2000:]}")
            end = time.monotonic()
            self._refs[name] = (self.final_state(d), end - (t_ready or t0), end - t0)
        return self._refs[name]

    # -- faults ----------------------------------------------------------------------------------
    def kill9(self, trials: int, tally: Tally, data: Path | None = None, ref: str = "plain", extra=()) -> Tally:
        from ..rundir.checkpoint import TMP_PREFIX, list_checkpoints

        want, train_s, _ = self.reference(ref, data, extra=extra)
        for _ in range(trials):
            d = self._dir("kill9")
            rc, _, sent, _ = self.run_until(self._args(d, data, extra), self.rng.uniform(0, train_s), signal.SIGKILL)
            newest = list_checkpoints(d / "checkpoints")
            newest_step = int(newest[-1].name[5:]) if newest else 0
            half = any(p.name.startswith(TMP_PREFIX) for p in (d / "checkpoints").glob("*"))
            rc2, out = self.run(self._args(d, data, extra))
            m = re.search(r"resumed from \S+ at step (\d+)", out)
            resumed = int(m.group(1)) if m else 0
            tally.trials += 1
            tally.survived += rc2 == 0
            ok = self.equal(self.final_state(d), want)
            tally.bit_equal += ok
            lost = resumed < newest_step
            tally.data_lost += lost
            if not sent:
                tally.notes.append("finished before the kill")
            elif half:
                tally.notes.append("killed mid-save (temporary directory left, ignored)")
            if rc2 != 0 or not ok or lost:
                tally.notes.append(f"{d.name}: rc {rc2}, bit-equal {ok}, resumed at {resumed}, newest {newest_step}: "
                                   f"{out.strip().splitlines()[-1] if out.strip() else ''}")
        return tally

    def sigterm(self, trials: int, tally: Tally) -> Tally:
        want, train_s, _ = self.reference()
        for _ in range(trials):
            d = self._dir("sigterm")
            rc, out, sent, exit_s = self.run_until(self._args(d), self.rng.uniform(0, train_s), signal.SIGTERM)
            m = re.search(r"stopped by SIGTERM at step (\d+) \((\d+) step\(s\) after the signal\)", out)
            tally.trials += 1
            if rc == 0:
                tally.notes.append("finished before the signal")
            elif not (m and rc == 128 + signal.SIGTERM and "resume with: speedgpt train --resume" in out):
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
                p = self.start(self._args(d, data))
                out = ""
                for line in p.stdout:
                    out += line
                    if "model:" in line:
                        bad.write_bytes(bad.read_bytes()[:1500])
                p.wait()
                ok = p.returncode == 2 and f"bad training shard {bad} at byte 1500" in out
                tally.survived += ok
                tally.notes.append(f"stop: rc {p.returncode}, {'named file and offset' if ok else out[-300:]}")
            else:  # skip: killed and resumed, equal to an uninterrupted skipping run
                data = self.work / "data-bad"
                if not data.exists():
                    shutil.copytree(self.data, data)
                    bad = data / "train_000003.bin"
                    bad.write_bytes(bad.read_bytes()[:1500])
                sub = Tally()
                self.kill9(1, sub, data=data, ref="bad", extra=["--data.on_bad_shard=skip"])
                tally.survived += sub.survived
                tally.bit_equal += sub.bit_equal
                tally.data_lost += sub.data_lost
                tally.notes.append(f"skip + kill -9 + resume: bit-equal {bool(sub.bit_equal)}")
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
        want, _, _ = self.reference("gloo2", torchrun=True)
        for _ in range(trials):
            step = self.rng.randrange(3, STEPS - 1)
            d = self._dir("worker")
            rc, out = self.run(self._args(d), inject=f"exit@{step}:1", torchrun=True)
            (d.parent / f"{d.name}.log").write_text(out)
            m = re.search(r"resumed from \S+ at step (\d+)", out)
            tally.trials += 1
            tally.survived += rc == 0 and m is not None
            ok = self.equal(self.final_state(d), want)
            tally.bit_equal += ok
            tally.notes.append(f"rank 1 exited at step {step + 1}; group restarted, resumed at step "
                               f"{m.group(1) if m else '?'}, rc {rc}, bit-equal {ok}")
        return tally


def _flatten(obj, prefix=""):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): obj}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Fault-injection suite: faulted `speedgpt train` runs, resumed, "
                                            "compared bit for bit with an uninterrupted run (CPU).")
    p.add_argument("--trials", type=int, default=10, help="kill -9 trials (default 10)")
    p.add_argument("--each", type=int, default=2, help="trials of every other fault (default 2)")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma list of {', '.join(FAULTS)}")
    p.add_argument("--workdir", default="fault-suite", help="where runs are written (default ./fault-suite)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    chosen = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(chosen) - set(FAULTS))
    if unknown:
        p.error(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    suite = Suite(Path(args.workdir), seed=args.seed)
    results = {}
    t0 = time.monotonic()
    for name in chosen:
        n = args.trials if name == "kill9" else args.each
        tally = getattr(suite, name)(n, Tally())
        results[name] = tally
        print(f"{name:8s} trials {tally.trials:3d} | survived {tally.survived:3d} | bit-equal {tally.bit_equal:3d} | "
              f"data lost {tally.data_lost:3d}", flush=True)
    print(f"({time.monotonic() - t0:.0f}s)")
    (Path(args.workdir) / "results.json").write_text(json.dumps(
        {k: v.__dict__ for k, v in results.items()}, indent=1))
    failed = any(t.data_lost or t.survived < t.trials for t in results.values())
    return 1 if failed else 0
