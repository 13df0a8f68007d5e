"""The CI-sized part of the fault-injection suite (speedgpt/train/fault_suite.py): real CLI runs,
faulted, resumed, and compared bit for bit with an uninterrupted run. The full measurement is
`python scripts/fault_suite.py --trials 100 --faults kill9` (docs/reliability.md).

Kill and signal times are random, but no assertion depends on when they land: every outcome
(killed before the first checkpoint, mid-save, after the end) must resume to the same weights."""

import pytest

from speedgpt.train.fault_suite import Suite, Tally


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


def test_killed_worker_of_two_process_gloo_run_restarts_and_resumes(suite):
    _clean(suite.worker(1, Tally()))
