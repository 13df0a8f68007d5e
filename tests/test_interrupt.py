"""Ctrl-C while torch loads (speedgpt/interrupt.py): torch's C init clears a failed numpy import, so
a KeyboardInterrupt raised inside it was swallowed (a run trained on and exited 0, or failed later
with "module 'numpy' has no attribute 'matrix'"). The signal is held over the import and acted on after."""

from __future__ import annotations

import os
import signal

import pytest

from speedgpt.interrupt import holding_ctrl_c


@pytest.fixture(autouse=True)
def pythons_own_ctrl_c_handler():
    """Each test starts as a `speedgpt` run from a terminal does, with Python's own SIGINT handler. A suite
    started as a background job of a non-interactive shell (`cmd &` in a script, some CI runners) inherits
    SIGINT ignored, and there no KeyboardInterrupt is raised: these tests failed so, the code had not changed."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def swallowing_import(log: list[str]):
    """Like torch's C init: a Ctrl-C lands inside, and the code there swallows whatever it raises."""
    def fn():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # bytecodes: where Python runs signal handlers
                pass
            log.append("not interrupted")
        except BaseException:  # noqa: B036 - torch's C code clears every error of the numpy import
            log.append("swallowed")
        log.append("import done")
    return fn


def test_a_swallowing_import_loses_a_ctrl_c_without_the_hold():
    log: list[str] = []
    swallowing_import(log)()  # Python's own handler: the KeyboardInterrupt is raised inside, and lost
    assert log == ["swallowed", "import done"]


def test_the_hold_lets_the_import_finish_then_raises_and_restores_the_handler():
    log: list[str] = []
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        holding_ctrl_c(swallowing_import(log))
    assert log == ["not interrupted", "import done"]
    assert signal.getsignal(signal.SIGINT) is before
    holding_ctrl_c(lambda: None)  # no signal: nothing raised


def test_ctrl_c_while_train_loads_torch_is_interrupted_and_130(tmp_path, monkeypatch, capsys):
    import speedgpt.interrupt as interrupt
    from speedgpt.cli import main

    monkeypatch.setattr(interrupt, "_import_numpy_and_torch", swallowing_import([]))
    rc = main(["train", "--train.device=cpu", f"--data.train_files={tmp_path / 'none'}", "--run-dir",
               str(tmp_path / "run")])
    assert rc == 130 and capsys.readouterr().err.strip() == "speedgpt train: interrupted"
    assert not (tmp_path / "run").exists()  # stopped before anything was written
