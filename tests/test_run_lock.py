"""One `speedgpt train` per run directory (rundir/lock.py), checked with real processes racing.

Both trains are held in their data step (the test holds the lock of the local corpus they wait to
read), which is after the "already holds a run" check and before the first file of the run is
written: without the run-directory lock both pass the check there and go on to write one directory."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from speedgpt.cli import main
from speedgpt.config import apply_overrides, load_preset
LOCK_FILE = ".speedgpt-run.lock"  # rundir/lock.py (spelled out: the test also runs against code without it)

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
DATA_LINE = "using the local Python-source corpus"


def start_train(tmp_path: Path, name: str, *argv: str) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "speedgpt", "train", *argv], cwd=tmp_path, env=env,
                                stdout=o, stderr=e)
    return proc, out, err


def wait_for(condition, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)


def test_two_trains_on_one_run_dir_and_a_resume_while_it_runs(tmp_path, capsys, text_shards):
    run = tmp_path / "run"
    data_keys = [*TINY_OVERRIDES, f"--data.cache_dir={tmp_path / 'cache'}", "--data.local_max_tokens=50000"]
    corpus = apply_overrides(load_preset("tiny-cpu"), data_keys).data.default_corpus_dir()
    corpus.mkdir(parents=True)
    argv = [*data_keys, "--run-dir", str(run)]
    with open(corpus / ".lock", "w") as corpus_lock:
        fcntl.flock(corpus_lock, fcntl.LOCK_EX)  # both trains wait here, in their data step
        procs = [start_train(tmp_path, name, *argv) for name in ("a", "b")]

        def reached_data(i: int) -> bool:
            return DATA_LINE in procs[i][1].read_text()

        def settled() -> bool:  # both in the data step (no lock), or one refused and the other there
            done = [p.poll() is not None for p, _, _ in procs]
            return (reached_data(0) or done[0]) and (reached_data(1) or done[1])

        try:
            wait_for(settled)
            running = [i for i in range(2) if procs[i][0].poll() is None]
            assert len(running) == 1, "both trains passed the run directory's checks: they would mix one directory"
            winner, loser = procs[running[0]][0], procs[1 - running[0]]
            assert loser[0].returncode == 2
            err = loser[2].read_text().strip()
            assert len(err.splitlines()) == 1, err
            assert f"--run-dir {run} is in use by a training run in progress (pid {winner.pid} on " in err
            assert f"kill {winner.pid}" in err and "pick another --run-dir" in err
            record = json.loads((run / LOCK_FILE).read_text())
            assert record["pid"] == winner.pid and "--run-dir" in record["command"]

            # --resume while the first run is going: "in progress", not "no checkpoint" / "holds no run"
            rc = main(["train", "--resume", str(run)])
            err = capsys.readouterr().err.strip()
            assert rc == 2 and len(err.splitlines()) == 1, err
            assert f"--resume {run}: the run is in progress, trained by pid {winner.pid}" in err
        finally:
            for p, _, _ in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)  # a crash: its lock file stays behind
                p.wait()

    # The dead run's lock is taken over with a notice; the new run trains, then removes the lock file.
    assert json.loads((run / LOCK_FILE).read_text())["pid"] == winner.pid
    assert main(["train", *TINY_OVERRIDES, "--train.steps=2", "--train.val_every=0",
                 f"--data.train_files={text_shards}", "--run-dir", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"speedgpt train: notice: {run} was locked by pid {winner.pid} on " in err
    assert "ended without releasing it; taking the lock over" in err
    assert not (run / LOCK_FILE).exists() and (run / "config.toml").is_file()


def test_a_refused_or_failed_command_leaves_no_directory_and_no_lock(tmp_path, capsys, text_shards):
    run = tmp_path / "new" / "run"
    assert main(["train", *TINY_OVERRIDES, "--model.depth=0", "--run-dir", str(run)]) == 2  # a config error
    assert "config error" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # nor the parent it made for it
    argv = ["train", *TINY_OVERRIDES, "--train.steps=2", "--train.val_every=0", f"--data.train_files={text_shards}",
            "--run-dir", str(run)]
    assert main(argv) == 0
    assert main(argv) == 2  # already holds a run: refused, and the run's files untouched
    assert "already holds a run" in capsys.readouterr().err
    assert not (run / LOCK_FILE).exists() and (run / "config.toml").is_file()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_run_dir_that_cannot_be_written_is_refused_before_the_data_step(tmp_path, capsys):
    """Was "[Errno 2] No such file or directory" (exit 1), after the data had been prepared."""
    missing_data = tmp_path / "no-such-data"  # the data step would fail on it: the run dir is checked first
    for run_dir in ("/proc/speedgpt-no-such-dir/run", "/proc/self/run"):
        assert main(["train", "--train.device=cpu", f"--data.train_files={missing_data}", "--run-dir", run_dir]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"speedgpt train: --run-dir {run_dir}"), err
        assert "pass another directory" in err or "pass a directory you can write to" in err
    if os.geteuid() != 0:  # root writes anywhere: a read-only directory stops only other users
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert main(["train", "--train.device=cpu", f"--data.train_files={missing_data}", "--run-dir",
                     str(ro / "run")]) == 2
        assert "no permission to write" in capsys.readouterr().err


def test_a_refused_command_waits_for_the_holders_record(tmp_path, monkeypatch):
    """The holder writes its record just after taking the lock: a command refused in between read an empty file and
    named a live run "a process that left no record" (the race above flaked on a busy 2-core machine). Here the holder
    writes its record only once the refused command waits (its first sleep): deterministic, no timing."""
    from speedgpt.rundir import lock as lock_module

    run = tmp_path / "run"
    run.mkdir()
    holder = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held, the file still empty
    record = {"pid": 4242, "host": "gpu-7", "started": "2026-12-07 03:00:00", "command": "speedgpt train"}

    def holder_writes_its_record(_seconds):
        os.write(holder, json.dumps(record).encode())

    monkeypatch.setattr(lock_module.time, "sleep", holder_writes_its_record)
    try:
        with pytest.raises(lock_module.RunLocked, match=r"in use by a training run in progress \(pid 4242 on gpu-7"):
            lock_module.lock_run_dir(run)
    finally:
        os.close(holder)
