"""Host syncs counted and placed (speedgpt/host_syncs.py) and bench's figure of them, with a callable that
warns as torch's sync debug mode does (no GPU here)."""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import pytest

from speedgpt.bench import format_results, host_sync_figures
from speedgpt.host_syncs import SYNC_WARNING, count_host_syncs

# what Python sees from torch's TORCH_WARN in warn_or_error_on_sync
TORCH_TEXT = SYNC_WARNING + " (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:156.)"


def sync_like_torch():
    warnings.warn(TORCH_TEXT, UserWarning)  # the line a site names: this file's, outside torch


def step_with_syncs():
    for _ in range(3):  # one line three times: Python's default filter would show it once
        sync_like_torch()
    warnings.warn(TORCH_TEXT, UserWarning)


def test_every_sync_is_counted_at_its_line():
    syncs = count_host_syncs(step_with_syncs, debug_mode=nullcontext)
    assert syncs.count == 4
    line = sync_like_torch.__code__.co_firstlineno + 1
    other = step_with_syncs.__code__.co_firstlineno + 3
    assert syncs.sites == {f"{__file__}:{line}": 3, f"{__file__}:{other}": 1}
    assert syncs.describe(limit=1) == f"{__file__}:{line} x3 (+1 more site)"


def test_the_debug_mode_is_on_around_the_work_and_other_warnings_are_not_swallowed():
    events = []

    class Mode:
        def __enter__(self):
            events.append("on")

        def __exit__(self, *exc):
            events.append("off")

    def work():
        events.append("work")
        warnings.warn("a warning of the step itself", RuntimeWarning)

    with pytest.warns(RuntimeWarning, match="of the step itself"):
        syncs = count_host_syncs(work, debug_mode=Mode)
    assert events == ["on", "work", "off"]
    assert syncs.count == 0 and syncs.sites == {}


class StepOnly:
    """What host_sync_figures asks of a trainer: one step, a device to wait for, timers to take."""

    def __init__(self, step_fn):
        self.step_fn, self.steps, self.grad_sync = step_fn, [], self

    def train_step(self, step):
        self.steps.append(step)
        self.step_fn()

    def sync_device(self):
        self.steps.append("synced")

    def take_timers(self):
        return []


def test_bench_reports_the_steps_syncs_and_their_sites():
    trainer = StepOnly(step_with_syncs)
    figures = host_sync_figures(trainer, 7, count=lambda fn: count_host_syncs(fn, debug_mode=nullcontext))
    assert trainer.steps == [7, "synced"]
    assert figures["host_syncs_per_step"] == 4 and figures["host_sync_sites"].endswith("x1")
    text = format_results([("A", {"tok_per_s": 1.0, "world_size": 1, **figures})], None)
    assert any(line.split() == ["host_syncs_per_step", "4"] for line in text.splitlines())
    assert f"A host syncs at: {__file__}:" in text

    clean = host_sync_figures(StepOnly(lambda: None), 7, count=lambda fn: count_host_syncs(fn, debug_mode=nullcontext))
    assert clean == {"host_syncs_per_step": 0}  # measured, none: a 0 in the table and no sites line
    text = format_results([("A", {"tok_per_s": 1.0, "world_size": 1, **clean})], None)
    assert any(line.split() == ["host_syncs_per_step", "0"] for line in text.splitlines()) and "syncs at" not in text
    assert "host_syncs_per_step" not in format_results([("A", {"tok_per_s": 1.0, "world_size": 1})], None)


def test_a_sync_inside_torch_is_named_at_the_code_that_called_torch():
    import traceback
    from pathlib import Path

    import torch

    import speedgpt

    ours = str(Path(speedgpt.__file__).parent / "train" / "loop.py")
    inside = str(Path(torch.__file__).parent / "_tensor.py")
    stack = [traceback.FrameSummary(ours, 213, "train_step"), traceback.FrameSummary(inside, 625, "backward")]
    from speedgpt.host_syncs import sync_site

    assert sync_site(stack, inside, 625) == "speedgpt/train/loop.py:213 (in torch/_tensor.py:625)"
    assert sync_site(stack[:1], ours, 213) == "speedgpt/train/loop.py:213"


def load_trace_host_ops():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "trace_host_ops.py"
    spec = importlib.util.spec_from_file_location("trace_host_ops", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_traces_host_syncs_and_eager_launches_are_named_by_their_ops():
    """A made-up trace of one profiled step: an eager op launching 2 kernels before the forward graph,
    a custom op that syncs inside it, the backward's thread syncing, and bench's own sync at the end."""
    from speedgpt.kernel_timeline import GRAPH_CALL, STEP_RANGE

    def x(cat, name, ts, dur, tid=1):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}

    events = [x("user_annotation", STEP_RANGE, 0, 1000),
              x("cpu_op", "aten::argsort", 10, 50), x("cpu_op", "aten::sort", 12, 40),
              x("cuda_runtime", "cudaLaunchKernel", 15, 2), x("cuda_runtime", "cudaLaunchKernel", 30, 2),
              x("cpu_op", GRAPH_CALL + " abc", 100, 300), x("cuda_runtime", "cudaLaunchKernel", 150, 2),
              x("cpu_op", "speedgpt::fp8_head_ce_fwd", 200, 100), x("cpu_op", "aten::copy_", 210, 50),
              x("cuda_runtime", "cudaStreamSynchronize", 220, 20),
              x("cpu_op", "autograd::engine::evaluate_function: X", 500, 100, tid=2),
              x("cuda_runtime", "cudaStreamSynchronize", 550, 5, tid=2),
              x("cuda_runtime", "cudaDeviceSynchronize", 900, 90)]
    lines = load_trace_host_ops().host_report(events)
    assert lines[0] == "step 1: 1.00 ms on the host; 3 host sync call(s)"
    assert "main, in speedgpt::fp8_head_ce_fwd > aten::copy_" in lines[1]
    assert "thread 2 (autograd: the backward's), in autograd::engine::evaluate_function: X" in lines[2]
    assert "bench --profile's own" in lines[3]
    assert lines[4] == ("  before graph call 1 at 0.10 ms: 2 kernel launches, 0 copies/memsets, ops taking 0.05 ms of "
                        "host time: aten::argsort x2")  # the launch inside the graph's call is not eager


def test_trace_host_ops_refuses_a_missing_trace_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        load_trace_host_ops().main([str(tmp_path / "none.json.gz")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no such file; give a trace written by bench --profile-trace" in err
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    with pytest.raises(SystemExit) as e:  # a trace, but of no bench step: not an empty report
        load_trace_host_ops().main([str(tmp_path / "empty.json")])
    assert e.value.code == 2 and "no speedgpt.bench.step range in the trace" in capsys.readouterr().err
