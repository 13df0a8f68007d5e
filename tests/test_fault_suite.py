"""The CI-sized part of the fault-injection suite (speedgpt/tools/fault_suite.py): real CLI runs,
faulted, resumed, and compared bit for bit with an uninterrupted run. The full measurement is
`python scripts/fault_suite.py --trials 100 --faults kill9` (docs/reliability.md).

Kill and signal times are random, but no assertion depends on when they land: every outcome
(killed before the first checkpoint, mid-save, after the end) must resume to the same weights."""

import json

import pytest
import torch

from speedgpt.tools.fault_runs import Runs, Tally, check_runs
from speedgpt.tools.fault_suite import Suite, compare_runs, main


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return Suite(tmp_path_factory.mktemp("faults"), seed=0, log=lambda *_: None)


def _clean(t: Tally, *, compared: bool = True) -> None:
    assert t.trials > 0 and t.survived == t.trials and t.data_lost == 0, t.notes
    if compared:
        assert t.bit_equal == t.trials, t.notes


def test_kill9_at_random_moments_resumes_bit_equal(suite):
    _clean(suite.kill9(2, Tally()))


def test_sigterm_checkpoints_within_one_step_and_resumes_bit_equal(suite):
    _clean(suite.sigterm(1, Tally()))


def test_injected_nan_abort_skip_rollback(suite):
    _clean(suite.nan(3, Tally()), compared=False)  # skip and rollback change the run by design


def test_truncated_shard_stop_and_skip(suite):
    t = suite.shard(2, Tally())
    assert t.survived == 2 and t.bit_equal == 1 and t.data_lost == 0, t.notes  # only the skip trial compares


def test_failing_checkpoint_write(suite):
    _clean(suite.save(1, Tally()))


def test_killed_worker_of_two_process_gloo_run_restarts_and_resumes(tmp_path, capsys):
    """Through the command line, with the run length and checkpoint cadence the GPU runs set."""
    assert main(["--faults", "worker", "--each", "1", "--steps", "10", "--checkpoint-every", "3",
                 "--workdir", str(tmp_path)]) == 0
    t = Tally(**json.loads((tmp_path / "results.json").read_text())["worker"])
    _clean(t)
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("worker fault on 2 x gloo, tiny-cpu (suite config), 10 steps: rank 1 exited at step ")
    assert "resumed at step 3, rc 0" in summary or "resumed at step 6, rc 0" in summary
    assert "bit-equal to the uninterrupted run" in summary and "final train loss" in summary


def test_the_worker_summary_gives_the_difference_when_not_bit_equal():
    want = {"model.w": torch.zeros(3), "model.b": torch.ones(2), "optim.m": torch.zeros(1)}
    got = dict(want, **{"model.b": torch.tensor([1.0, 1.5])})
    text = compare_runs(got, want, {"train_loss": 3.5, "val_loss": 3.25}, {"train_loss": 3.0, "val_loss": 3.25})
    assert "weights differ from the uninterrupted run: max |diff| 0.5 (in b)" in text
    assert "final train loss 3.500000 vs 3.000000 (+5.00e-01)" in text and "final val loss 3.250000 vs 3.250000" in text
    assert compare_runs(None, want, {}, {}) == "no final checkpoint to compare"


@pytest.mark.parametrize("runs, faults, says", [
    (Runs(nproc=4), ["kill9"], "apply to the worker fault only"),
    (Runs(nproc=1), ["worker"], "at least 2 processes"),
    (Runs(steps=4), ["worker"], "steps >= checkpoint-every + 3"),
    (Runs(device="cuda", nproc=64), ["worker"], "needs 64 GPUs"),
    (Runs(overrides=("--train.nope=1",)), ["worker"], "unknown config key 'train.nope'"),
])
def test_worker_options_that_cannot_run_are_refused_before_any_run(runs, faults, says):
    assert says in check_runs(runs, faults)
    assert check_runs(Runs(preset="speedrun-124m", steps=40, checkpoint_every=10, nproc=4,
                           overrides=("--data.val_tokens=65536",)), ["worker"]) is None
