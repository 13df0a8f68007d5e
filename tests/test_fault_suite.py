"""The CI-sized part of the fault-injection suite (speedgpt/tools/fault_suite.py): real CLI runs,
faulted, resumed, and compared bit for bit with an uninterrupted run. The full measurement is
`python scripts/fault_suite.py --trials 100 --faults kill9` (docs/reliability.md).

Kill and signal times are random, but no assertion depends on when they land: every outcome
(killed before the first checkpoint, mid-save, after the end) must resume to the same weights."""

import json

import pytest
import torch

from speedgpt.tools.fault_runs import Runs, Tally, check_runs
from speedgpt.tools.fault_runs import replay_and_drift
from speedgpt.tools.fault_suite import Suite, compare_runs, main


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return Suite(tmp_path_factory.mktemp("faults"), seed=0, log=lambda *_: None)


def _clean(t: Tally, *, compared: bool = True) -> None:
    # A trial whose run finished before its kill landed tests nothing: it counts as not killed (and only when
    # it stayed bit-equal), never as survived.
    assert t.trials > 0 and t.survived + t.not_killed == t.trials and t.data_lost == 0, t.notes
    if compared:
        assert t.bit_equal + t.not_killed == t.trials, t.notes


def test_kill9_at_random_moments_resumes_bit_equal(suite):
    _clean(suite.kill9(2, Tally()))


def test_sigterm_checkpoints_within_one_step_and_resumes_bit_equal(suite):
    _clean(suite.sigterm(1, Tally()))


def test_injected_nan_abort_skip_rollback(suite):
    _clean(suite.nan(3, Tally()), compared=False)  # skip and rollback change the run by design


def test_truncated_shard_stop_and_skip(suite):
    t = suite.shard(2, Tally())
    # only the skip trial compares (unless it finished before its kill: then it is not killed, not survived)
    assert t.survived + t.not_killed == 2 and t.bit_equal + t.not_killed == 1 and t.data_lost == 0, t.notes


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
    assert "before the fault its losses were bit-equal to the uninterrupted run's" in summary
    assert "bit-equal to the run's own losses before the fault" in summary or "no step replayed" in summary


def _finishes_before_the_kill(suite):
    """run_until as on a machine where the run ends before its kill or signal lands."""
    def run_until(args, when, sig, ready="model:"):
        rc, out = suite.run(args)
        return rc, out, False, 0.0
    return run_until


def test_a_trial_that_finished_before_its_kill_is_not_killed_not_survived(suite, monkeypatch):
    """Such a trial counted as survived and bit-equal: a suite where no kill landed printed a clean result."""
    monkeypatch.setattr(suite, "run_until", _finishes_before_the_kill(suite))
    for fault in (suite.kill9, suite.sigterm):
        t = fault(1, Tally())
        assert (t.trials, t.survived, t.bit_equal, t.not_killed) == (1, 0, 0, 1), t.notes
        assert t.failed()  # nothing was tested
        assert t.line("kill9", True).endswith("| not killed   1")
    t.trials += 1
    t.survived += 1
    assert not t.failed()  # one trial tested and survived, one not killed


def test_cli_shows_not_killed_trials_and_fails_when_nothing_was_tested(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(Suite, "run_until", lambda self, args, when, sig, ready="model:": (*self.run(args), False, 0.0))
    assert main(["--faults", "kill9", "--trials", "1", "--workdir", str(tmp_path / "w")]) == 1
    out, err = capsys.readouterr()
    assert "kill9    trials   1 | survived   0 | bit-equal   0 | data lost   0 | not killed   1" in out
    assert "every trial finished before its kill or signal landed; nothing was tested" in err
    assert json.loads((tmp_path / "w" / "results.json").read_text())["kill9"]["not_killed"] == 1


@pytest.mark.parametrize("args, says", [
    (["--faults", ","], "no fault chosen: --faults takes a comma list of kill9, sigterm, nan, shard, save, worker"),
    (["--faults", "kill9", "--trials", "-3"], "--trials must be >= 1 (got -3)"),
    (["--faults", "nan", "--each", "0"], "--each must be >= 1 (got 0)"),
    (["--faults", "kill9,oops"], "unknown fault(s) oops; choose from kill9"),
    (["--faults", "kill9", "--nproc", "4"], "apply to the worker fault only"),
])
def test_arguments_that_would_test_nothing_are_one_line_and_exit_2(tmp_path, capsys, args, says):
    """`--faults ,` printed (0s), wrote {} and exited 0; `--trials -3` printed "trials 0" and exited 0."""
    assert main([*args, "--workdir", str(tmp_path / "w")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("fault_suite: error: ") and says in err, err
    assert not (tmp_path / "w").exists()  # refused before anything was made


def test_a_workdir_holding_an_earlier_suite_is_refused(tmp_path, capsys):
    """A rerun there only auto-resumed the finished runs (no kill landed), printed the earlier counts, exit 0,
    and overwrote results.json."""
    (tmp_path / "results.json").write_text('{"kill9": "earlier"}')
    assert main(["--faults", "kill9", "--trials", "2", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"fault_suite: error: --workdir {tmp_path} is not empty; give a new directory (the suite writes " \
                  f"its runs there)\n"
    assert (tmp_path / "results.json").read_text() == '{"kill9": "earlier"}'
    (tmp_path / "file").write_text("x")
    assert main(["--faults", "kill9", "--workdir", str(tmp_path / "file" / "w")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


def _metrics(path, records):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 9, "trai')


def test_the_worker_summary_separates_the_restarts_error_from_run_to_run_differences(tmp_path):
    """As on 4 GPUs (2026-11-27): the runs part from step 3 on, before any fault; the resumed run replays its
    own steps 3-4 almost exactly."""
    ref = [{"step": s, "train_loss": v} for s, v in [(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0), (5, 5.0)]]
    killed = [{"step": 1, "train_loss": 9.0}, {"step": 2, "train_loss": 8.0}, {"step": 3, "train_loss": 7.25},
              {"step": 4, "train_loss": 6.5}, {"event": "resume", "step": 2},
              {"step": 3, "train_loss": 7.25}, {"step": 4, "train_loss": 6.5 + 1e-5}, {"step": 5, "train_loss": 5.5}]
    _metrics(tmp_path / "ref", ref)
    _metrics(tmp_path / "killed", killed)
    assert replay_and_drift(tmp_path / "killed", tmp_path / "ref") == (
        "steps 3-4 replayed after the resume within 1e-05 of the run's own losses before the fault; "
        "before the fault its losses already differed from the uninterrupted run's by up to 0.5 (from step 3 on: "
        "the same command's run-to-run difference)")
    _metrics(tmp_path / "same", ref[:2] + [{"event": "resume", "step": 2}] + ref[2:])
    assert replay_and_drift(tmp_path / "same", tmp_path / "ref") == (
        "no step replayed (killed at a checkpoint); before the fault its losses were bit-equal to the uninterrupted "
        "run's")
    assert replay_and_drift(tmp_path / "ref", tmp_path / "ref") == "no resume logged"


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
