import json
import re
import sys
import types

import pytest
import torch

from speedgpt.rundir.metrics import MetricsLogger, read_metrics, record_kind


def _train(step, loss=3.0, **kw):
    return {"step": step, "tokens": step * 1000, "time_s": step * 0.5, "train_loss": loss, "lr": 0.01, **kw}


def _eval(step, loss=3.5, **kw):
    return {"step": step, "tokens": step * 1000, "time_s": step * 0.5, "val_loss": loss, **kw}


def test_log_appends_one_flushed_json_line_per_record(tmp_path):
    run = tmp_path / "run"
    with MetricsLogger(run) as log:
        log.log(_train(1))
        # Visible on disk before close: a crash right after log() must not lose the line.
        assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
        log.log(_eval(1, val_bpb=1.1, event="eval"))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [_train(1), _eval(1, val_bpb=1.1, event="eval")]


def test_log_converts_tensor_scalars_and_requires_int_step(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log({"step": 2, "tokens": 10, "time_s": 1.0, "train_loss": torch.tensor(2.5)})
        with pytest.raises(ValueError, match="int 'step'"):
            log.log({"tokens": 10, "train_loss": 1.0})
        with pytest.raises(ValueError, match="int 'step'"):
            log.log({"step": 2.0, "train_loss": 1.0})
    assert read_metrics(tmp_path)[0]["train_loss"] == 2.5


def test_log_after_close_is_an_error(tmp_path):
    log = MetricsLogger(tmp_path)
    log.close()
    log.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        log.log(_train(1))


def test_disabled_logger_touches_nothing(tmp_path):
    run = tmp_path / "rank1"
    with MetricsLogger(run, enabled=False, tensorboard=True, wandb=True) as log:
        log.log(_train(1))
        log.log({"no": "step"})  # no validation either: non-zero ranks pay nothing
    assert not run.exists()


def test_read_metrics_tolerates_truncated_last_line(tmp_path):
    good = [json.dumps(_train(1)), json.dumps(_train(2))]
    (tmp_path / "metrics.jsonl").write_text("\n".join(good) + '\n{"step": 3, "tokens": 30')
    with pytest.warns(UserWarning, match="line 3"):
        recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2]


def test_read_metrics_skips_a_line_with_a_damaged_byte(tmp_path):
    """A byte that is no UTF-8 made the whole file one bare UnicodeDecodeError (`report` showed it, naming no fix):
    only its line is lost now, with the unreadable-line warning."""
    good = [json.dumps({"step": s, "train_loss": 1.0}).encode() for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_bytes(good[0] + b"\n" + b'{"step": 3, "train_\xff": 1}\n' + good[1] + b"\n")
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable line\(s\) \(line 2\)"):
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_logger_reopening_after_crash_starts_a_fresh_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_train(1)) + '\n{"step": 2, "tok')
    with MetricsLogger(tmp_path) as log:
        log.log({**_train(1), "event": "resume"})
        log.log(_train(2, loss=2.0))
    with pytest.warns(UserWarning, match="1 unreadable"):
        recs = read_metrics(tmp_path)
    assert [(r["step"], r["train_loss"]) for r in recs] == [(1, 3.0), (2, 2.0)]


def test_read_metrics_dedups_by_step_and_kind_later_wins(tmp_path):
    lines = [_train(1, 5.0), _train(2, 4.0), _eval(2, 4.5), _train(3, 3.9),
             _train(2, 3.0), _eval(2, 3.5), {"step": 2, "tokens": 2000, "time_s": 1.0, "hellaswag_acc": 0.3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    recs = read_metrics(tmp_path / "metrics.jsonl")  # the file path works too
    got = [(r["step"], record_kind(r), r.get("train_loss", r.get("val_loss"))) for r in recs]
    assert got == [(1, "train", 5.0), (2, "train", 3.0), (2, "eval", 3.5), (2, "eval:hellaswag_acc", None),
                   (3, "train", 3.9)]


def test_a_speedgpt_eval_record_keeps_trainings_final_validation(tmp_path):
    """`speedgpt eval RUN` appends its loss at the run's last step: it replaced training's final validation there, so
    the finished run read as unfinished (`train --resume` validated it again, "which the stop left out"; ab and sweep
    passed it over)."""
    from speedgpt.rundir.metrics import ended_by
    from speedgpt.train.resume import validated_at

    lines = [_eval(0, 10.8), _train(4, 9.6), _eval(4, 7.7), _eval(4, 7.6, event="eval", eval_tokens=208896)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    recs = read_metrics(tmp_path)
    assert [(r["step"], r["val_loss"], r.get("event")) for r in recs if "val_loss" in r] == [
        (0, 10.8, None), (4, 7.7, None), (4, 7.6, "eval")]
    assert ended_by(recs, 4) == "steps" and validated_at(tmp_path, 4)


def test_resume_event_drops_the_abandoned_timeline(tmp_path):
    # Crashed after step 5, resumed from the step-3 checkpoint, then stopped at step 4.
    lines = [_train(s, 10 - s) for s in range(1, 6)] + [_eval(5, 9.0)]
    lines += [{"step": 3, "tokens": 3000, "time_s": 1.5, "event": "resume"}, _train(4, 1.0)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    recs = read_metrics(tmp_path)
    assert [(r["step"], r.get("train_loss")) for r in recs] == [(1, 9), (2, 8), (3, 7), (3, None), (4, 1.0)]


def test_read_metrics_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope[/\\]metrics.jsonl"):
        read_metrics(tmp_path / "nope")


class _FakeWriter:
    instances = []

    def __init__(self, log_dir):
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        _FakeWriter.instances.append(self)

    def add_scalar(self, key, value, step):
        self.scalars.append((key, value, step))

    def close(self):
        self.closed = True


def test_tensorboard_forwarding(tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _FakeWriter.instances.clear()
    with MetricsLogger(tmp_path, tensorboard=True) as log:
        log.log({**_train(7), "event": "x", "flag": True})
    (w,) = _FakeWriter.instances
    assert w.log_dir == str(tmp_path / "tb") and w.closed
    assert sorted(w.scalars) == [("lr", 0.01, 7), ("time_s", 3.5, 7), ("tokens", 7000, 7), ("train_loss", 3.0, 7)]


def test_wandb_forwarding(tmp_path, monkeypatch):
    calls = {}

    class Run:
        def log(self, data, step):
            calls.setdefault("log", []).append((data, step))

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.update(init=kw) or Run()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with MetricsLogger(tmp_path, wandb=True, wandb_project="p", run_name="r1", config={"a": 1}) as log:
        log.log(_eval(4))
    assert calls["init"]["project"] == "p" and calls["init"]["name"] == "r1" and calls["init"]["config"] == {"a": 1}
    assert calls["log"] == [({"tokens": 4000, "time_s": 2.0, "val_loss": 3.5}, 4)]
    assert calls["finished"]


@pytest.mark.parametrize("kw,module,extra", [
    ({"tensorboard": True}, "torch.utils.tensorboard", "speedgpt[tensorboard]"),
    ({"wandb": True}, "wandb", "speedgpt[wandb]"),
])
def test_missing_optional_backend_says_which_extra(tmp_path, monkeypatch, kw, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # None in sys.modules makes import raise
    with pytest.raises(ImportError, match=re.escape(f"pip install '{extra}'")):
        MetricsLogger(tmp_path / "r", **kw)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
