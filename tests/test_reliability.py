"""Training under faults: signals, NaNs, failing saves, bad shards, restarts (issue 19)."""

import json
import os
import signal
import subprocess
from pathlib import Path
import sys

import numpy as np
import pytest
import torch

from speedgpt.config import apply_overrides
from speedgpt import faults
from speedgpt.rundir.checkpoint import CheckpointSaveError, list_checkpoints, load_checkpoint
from speedgpt.train.guard import NonFiniteError
from speedgpt.train.checkpointing import should_resume
from speedgpt.train.loop import train
from speedgpt.train.preempt import TrainingStopped

BASE = ["--train.steps=8", "--train.val_every=0", "--train.log_every=4", "--train.keep_checkpoints=0"]


@pytest.fixture
def inject(monkeypatch):
    def plan(spec: str):
        monkeypatch.setenv("SPEEDGPT_INJECT", spec)
        faults.reset()

    faults.reset()
    yield plan
    faults.reset()


@pytest.fixture
def cfg(small_vocab_cfg):
    return apply_overrides(small_vocab_cfg, BASE)


@pytest.fixture(scope="module")
def reference(counting_shards, tmp_path_factory):
    """The uninterrupted 8-step run every faulty run is compared with (`cfg`'s)."""
    from conftest import counting_overrides
    from speedgpt.config import load_preset

    base = apply_overrides(load_preset("tiny-cpu"), counting_overrides(counting_shards) + BASE)
    return train(base, run_dir=tmp_path_factory.mktemp("ref") / "run", quiet=True)


def _records(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sigterm_saves_within_one_step_and_resumes_exactly(cfg, reference, tmp_path, inject):
    run = tmp_path / "run"
    inject("sigterm@3")  # arrives while step 4 (1-based) is computed
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingStopped) as e:
        train(cfg, run_dir=run, quiet=True)
    stop = e.value
    assert stop.exit_code == 128 + signal.SIGTERM and stop.step == 4 and stop.steps_after_signal == 1
    assert f"resume with: speedgpt train --resume {run}" in str(stop)
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000004"]
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored after training
    inject("")
    resumed = train(cfg, run_dir=run, resume=True, quiet=True)
    assert resumed.train_losses == reference.train_losses[4:]  # bitwise on CPU
    # the curve has no gap: the stopped step's loss was logged before the stop (it was missing)
    logged = sorted({r["step"] for r in _records(run) if "train_loss" in r})
    assert logged == sorted({r["step"] for r in _records(reference.run_dir) if "train_loss" in r})


def test_a_run_stopped_in_its_last_step_is_resumed_to_its_final_validation(cfg, reference, tmp_path, inject):
    """A signal in the last step saves that step's checkpoint before the final validation. The resume said
    "complete; nothing to train" and exited 0, so the run never got its final validation (ab and sweep then
    could not use it, whatever they did). The resume now validates it, and only that."""
    run = tmp_path / "run"
    inject("sigterm@7")  # arrives while step 8 of 8 is computed
    with pytest.raises(TrainingStopped) as e:
        train(cfg, run_dir=run, quiet=True)
    assert e.value.step == 8 and not [r for r in _records(run) if "val_loss" in r]
    inject("")
    resumed = train(cfg, run_dir=run, resume=True, quiet=True)
    assert resumed.steps == 8 and resumed.train_losses == []  # nothing trained again
    assert resumed.val_loss == reference.val_loss  # the model of step 8, scored as the whole run scored it
    assert [r["step"] for r in _records(run) if "val_loss" in r] == [8]
    from speedgpt.train.resume import RunComplete

    with pytest.raises(RunComplete):  # now complete: a further resume has nothing to do
        train(cfg, run_dir=run, resume=True, quiet=True)


def test_a_run_stopped_in_the_step_that_spent_its_time_budget_is_resumed_to_its_final_validation(cfg, tmp_path,
                                                                                                   inject):
    """The same stop at the time budget's step: the resume said "complete (time budget spent)" and exited 0 without
    the final validation, so ab and sweep could not use the run. It now validates, and trains nothing."""
    from speedgpt.rundir.metrics import ENDED_BY_TIME_BUDGET, ended_by, read_metrics
    from speedgpt.train.resume import RunComplete

    cfg = apply_overrides(cfg, ["--train.time_budget_s=1e-9"])  # spent by the first step, whatever the machine
    run = tmp_path / "run"
    inject("sigterm@0")  # arrives while step 1 is computed
    with pytest.raises(TrainingStopped) as e:
        train(cfg, run_dir=run, quiet=True)
    assert e.value.step == 1 and ended_by(read_metrics(run), cfg.train.steps) is None
    inject("")
    resumed = train(cfg, run_dir=run, resume=True, quiet=True)
    assert resumed.steps == 1 and resumed.train_losses == [] and resumed.val_loss is not None
    assert [r["step"] for r in _records(run) if "val_loss" in r] == [1]
    assert ended_by(read_metrics(run), cfg.train.steps) == ENDED_BY_TIME_BUDGET
    with pytest.raises(RunComplete, match=r"time budget of 1e-09s spent\); nothing to train\. To train it further: "
                                          r"speedgpt train --resume .* --train\.time_budget_s=S \(more than 1e-09, or 0"):
        train(cfg, run_dir=run, resume=True, quiet=True)  # now finished; the advice was --train.steps=N --extend
    from speedgpt.config import ConfigError

    with pytest.raises(ConfigError, match=r"its time budget of 1e-09s is spent, so it would train no step; add "
                                          r"--train\.time_budget_s=S"):  # it said complete, exit 0
        train(apply_overrides(cfg, ["--train.steps=16"]), run_dir=run, resume=True, extend=True, quiet=True)
    more = train(apply_overrides(cfg, ["--train.time_budget_s=0"]), run_dir=run, resume=True, quiet=True)
    assert more.steps == cfg.train.steps and len(more.train_losses) == cfg.train.steps - 1  # the advice works


def test_a_stop_the_budget_check_missed_is_finished_by_its_resume(cfg, tmp_path, inject, monkeypatch):
    """On several ranks the budget is read on logging steps only: a signal between two reads saves a spent time with
    no time-budget record. The resume validated, but without that record the run still read as unfinished (ab
    called it crashed, sweep retried it)."""
    from speedgpt.rundir.metrics import ENDED_BY_TIME_BUDGET, ended_by, read_metrics
    from speedgpt.train.control import RunControl

    cfg = apply_overrides(cfg, ["--train.time_budget_s=1e-9"])
    run = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(RunControl, "budget_spent", lambda self, step, train_time: False)  # step 1 is no logging step
        inject("sigterm@0")
        with pytest.raises(TrainingStopped):
            train(cfg, run_dir=run, quiet=True)
    assert not [r for r in _records(run) if r.get("event") == "time_budget"]
    inject("")
    resumed = train(cfg, run_dir=run, resume=True, quiet=True)
    assert resumed.steps == 1 and resumed.train_losses == []
    assert ended_by(read_metrics(run), cfg.train.steps) == ENDED_BY_TIME_BUDGET


def test_a_second_signal_exits_at_once(tmp_path):
    code = ("import os, signal\n"
            "from speedgpt.train.preempt import StopRequest\n"
            "with StopRequest() as r:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    while not r.signum: pass\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    while True: pass\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert p.returncode == 128 + signal.SIGTERM
    assert "SIGTERM again: exiting now" in p.stderr


def test_nan_abort_names_step_rank_and_last_good_checkpoint(cfg, tmp_path, inject):
    run = tmp_path / "run"
    inject("nan@5")
    with pytest.raises(NonFiniteError, match=r"at step 6 \(rank 0\); the last good checkpoint is "
                                             + str(run / "checkpoints" / "step_000004")):
        train(apply_overrides(cfg, ["--train.checkpoint_every=4"]), run_dir=run, quiet=True)
    # The NaN weights of step 8 were never saved.
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000004"]


def test_a_fault_planned_for_a_step_the_warmup_also_trains_fires_in_the_run(cfg, tmp_path, inject):
    """The compile warmup trains step 0 too: the fault must wait for the run's own step 0 (it used to
    fire in the warmup, whose state is then thrown away, and never reach the run)."""
    inject("nan@0")
    with pytest.raises(NonFiniteError, match=r"at step 1 \(rank 0\)"):
        train(apply_overrides(cfg, ["--train.warmup_steps=2", "--train.steps=4"]), run_dir=tmp_path / "run", quiet=True)


def test_nan_skip_leaves_the_update_out(cfg, tmp_path, inject):
    run = tmp_path / "run"
    inject("nan@3")  # the 4th and last step
    c = apply_overrides(cfg, ["--train.steps=4", "--train.checkpoint_every=3", "--train.on_nonfinite=skip"])
    result = train(c, run_dir=run, quiet=True)
    assert result.steps == 4 and not np.isfinite(result.train_losses[3])
    before, _, _ = load_checkpoint(run / "checkpoints" / "step_000003")
    after, _, _ = load_checkpoint(run / "checkpoints" / "step_000004")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [r["skipped_steps"] for r in _records(run) if "skipped_steps" in r] == [1]


def test_nan_skip_changes_nothing_when_all_is_finite(cfg, reference, tmp_path):
    result = train(apply_overrides(cfg, ["--train.on_nonfinite=skip"]), run_dir=tmp_path / "run", quiet=True)
    assert result.train_losses == reference.train_losses


def test_nan_rollback_reloads_and_lowers_the_lr(cfg, tmp_path, inject):
    run = tmp_path / "run"
    inject("nan@5")
    c = apply_overrides(cfg, ["--train.checkpoint_every=4", "--train.on_nonfinite=rollback"])
    result = train(c, run_dir=run, quiet=True)
    assert result.steps == 8 and len(result.train_losses) == 8 and np.isfinite(result.train_losses).all()
    (event,) = [r for r in _records(run) if r.get("event") == "rollback"]
    assert event["step"] == 4 and event["bad_step"] == 6 and event["lr_scale"] == 0.5
    assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])[2]["lr_scale"] == 0.5


def test_failed_save_keeps_training_and_the_previous_checkpoint(cfg, reference, tmp_path, inject):
    run = tmp_path / "run"
    inject("save_error@4")
    result = train(apply_overrides(cfg, ["--train.checkpoint_every=2"]), run_dir=run, quiet=True)
    assert result.train_losses == reference.train_losses  # a failed save changes nothing else
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000002", "step_000006", "step_000008"]
    (event,) = [r for r in _records(run) if r.get("event") == "checkpoint_failed"]
    assert "the previous checkpoint" in event["error"] and "step_000002 is intact" in event["error"]


def test_failed_final_save_is_an_error(cfg, tmp_path, inject):
    inject("save_error@3")
    with pytest.raises(CheckpointSaveError, match="no earlier checkpoint exists"):
        train(apply_overrides(cfg, ["--train.steps=3"]), run_dir=tmp_path / "run", quiet=True)


def test_time_based_checkpoints(cfg, tmp_path):
    run = tmp_path / "run"
    train(apply_overrides(cfg, ["--train.steps=3", "--train.checkpoint_every_min=1e-9"]), run_dir=run, quiet=True)
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [f"step_00000{i}" for i in (1, 2, 3)]


def test_auto_resume_and_torchrun_restarts(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert not should_resume("auto", tmp_path) and not should_resume(False, tmp_path)
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    assert should_resume("auto", tmp_path) and not should_resume(False, tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a worker torchrun restarted
    assert should_resume(False, tmp_path)


def test_bad_shard_skipped_in_training_is_counted(tiny_cfg, small_shards, tmp_path):
    (small_shards / "train_000002.bin").write_bytes((small_shards / "train_000002.bin").read_bytes()[:3000])
    c = apply_overrides(tiny_cfg, BASE + [f"--data.train_files={small_shards}/train_*.bin",
                                          f"--data.val_files={small_shards}/val_*.bin", "--data.on_bad_shard=skip"])
    with pytest.warns(UserWarning, match=r"skipping bad shard .*train_000002.bin at byte 3000"):
        result = train(c, run_dir=tmp_path / "run", quiet=True)
    assert result.steps == 8
    assert [r["bad_shards"] for r in _records(tmp_path / "run") if "bad_shards" in r] == [1]


@pytest.fixture
def small_shards(text_shards, tmp_path):
    """The test corpus as six train shards of 1,200 tokens, so a run of a few steps crosses several."""
    from speedgpt.data.shards import load_shard, write_shard

    tokens = load_shard(text_shards / "train_000000.bin").numpy()
    out = tmp_path / "small"
    for i in range(6):
        write_shard(out / f"train_{i:06d}.bin", tokens[i * 1200:(i + 1) * 1200])
    write_shard(out / "val_000000.bin", load_shard(text_shards / "val_000000.bin").numpy())
    return out


def _loader(files, **kw):
    from speedgpt.data.loader import TokenLoader

    return TokenLoader(files, seq_len=64, batch_size=4, prefetch=False, **kw)


def test_bad_shard_met_mid_run_stops_with_file_and_offset(small_shards):
    from speedgpt.data.shards import ShardError

    loader = _loader(str(small_shards / "train_*.bin"))
    bad = small_shards / "train_000001.bin"
    bad.write_bytes(bad.read_bytes()[:2000])  # breaks after the loader checked every header
    with pytest.raises(ShardError, match=f"bad training shard {bad} at byte 2000, met during training: .*"
                                         f"--data.on_bad_shard=skip"):
        for _ in range(40):
            loader.next_batch()


def test_skipped_bad_shard_resumes_exactly_from_any_batch(small_shards):
    bad = small_shards / "train_000002.bin"
    bad.write_bytes(bad.read_bytes()[:1500])
    files = str(small_shards / "train_*.bin")
    with pytest.warns(UserWarning, match="skipping bad shard"):
        full = _loader(files, on_bad_shard="skip")
        states, batches = [], []
        for _ in range(50):  # more than an epoch: the shard stays out of the later ones too
            states.append(full.state_dict())
            batches.append(full.next_batch()[0])
    assert full.skipped_shards == {"train_000002.bin": 0} and full.epoch >= 1
    good = {int(t) for i in (0, 1, 3, 4, 5) for t in np.unique(np.fromfile(small_shards / f"train_{i:06d}.bin",
                                                                           dtype=np.uint16, offset=1024))}
    assert all(set(np.unique(b.numpy()).tolist()) <= good | {50256} for b in batches)
    for start in (0, 4, 9, 30):
        with _maybe_warns():
            resumed = _loader(files, on_bad_shard="skip")
            resumed.load_state_dict(states[start])
            again = [resumed.next_batch()[0] for _ in range(50 - start)]
        assert all(torch.equal(a, b) for a, b in zip(again, batches[start:]))


class _maybe_warns:
    """Resuming before the skip meets the bad shard again (a warning); after it, not."""

    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def _stop_worker(rank, world, cfg_dict, run_dir, out):
    from speedgpt.config import config_from_plain

    os.environ["SPEEDGPT_INJECT"] = "sigterm@2:1"  # only rank 1 is signalled, during step 3
    faults.reset()
    try:
        train(config_from_plain(cfg_dict), run_dir=run_dir, quiet=True)
    except TrainingStopped as e:
        (Path(out) / f"rank{rank}.json").write_text(json.dumps({"step": e.step, "signal": e.signum}))


def test_a_signal_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    from test_parallel_train import make_shards, run_cfg

    from distkit import spawn_local

    cfg = apply_overrides(run_cfg(make_shards(tmp_path / "data")), ["--train.checkpoint_every=0"])
    spawn_local(_stop_worker, 2, cfg.to_dict(), str(tmp_path / "run"), str(tmp_path))
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert got == [{"step": 3, "signal": signal.SIGTERM}] * 2
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step_000003"]


@pytest.mark.parametrize("resumed", [False, True])
def test_a_start_that_fails_after_a_stop_signal_is_reported_as_the_stop(cfg, tmp_path, monkeypatch, inject,
                                                                        resumed):
    """A process-group SIGTERM (timeout, Slurm) also kills torch.compile's compiler workers, so the compile raises
    (CppCompileError on the 2-core VM): the run must say it was stopped (exit 143), not fail with the compile error."""
    from speedgpt.train.loop import Trainer
    from speedgpt.train.preempt import StoppedMidStep

    run = tmp_path / "run"
    if resumed:  # a run stopped at step 4 with its checkpoint
        inject("sigterm@3")
        with pytest.raises(TrainingStopped):
            train(cfg, run_dir=run, quiet=True)
        inject("")

    def killed_compile(self):
        os.kill(os.getpid(), signal.SIGTERM)
        raise RuntimeError("C++ compile error\nCommand: g++ ...")

    monkeypatch.setattr(Trainer, "warmup_then_reset", killed_compile)
    with pytest.raises(StoppedMidStep) as e:
        train(cfg, run_dir=run, resume=resumed, quiet=True)
    step = 4 if resumed else 0
    assert e.value.exit_code == 128 + signal.SIGTERM and e.value.step == step
    assert f"stopped by SIGTERM before step {step + 1} finished" in str(e.value)
    assert "RuntimeError: C++ compile error" in str(e.value) and "\n" not in str(e.value)
    tail = f"resume with: speedgpt train --resume {run}" if resumed else "nothing was saved: run the same command again"
    assert str(e.value).endswith(tail)
    assert _records(run)[-1] | {"time_s": 0} == {"event": "stopped", "step": step, "tokens": _records(run)[-1]["tokens"],
                                                 "time_s": 0, "signal": signal.SIGTERM, "error": "RuntimeError"}


def test_an_error_without_a_stop_signal_stays_that_error(cfg, tmp_path, monkeypatch):
    from speedgpt.train.loop import Trainer

    def broken_compile(self):
        raise RuntimeError("C++ compile error")

    monkeypatch.setattr(Trainer, "warmup_then_reset", broken_compile)
    with pytest.raises(RuntimeError, match="C.. compile error"):
        train(cfg, run_dir=tmp_path / "run", quiet=True)
