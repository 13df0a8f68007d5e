"""The communication-against-compute arithmetic of `bench --profile` (speedgpt/kernel_timeline.py)
on synthetic kernel spans, the reading of profiler events (fake GPU events; the CPU side from a
real CPU profile), without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speedgpt.kernel_timeline import (STEP_RANGE, Kernel, covered, kernel_category, load_trace, mean_overlap, merged,
                                      overlap, profiled_steps, split_by_step, step_overlap, trace_kernels, trace_ops)
from speedgpt.step_timeline import backward_end, trace_report

NCCL = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_union_and_intersection_of_spans():
    assert merged([(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]) == [(0, 4), (5, 7)]  # touching joined, empty dropped
    assert covered([(0, 2), (1, 3), (5, 7)]) == 5
    assert overlap([(0, 10)], [(2, 3), (2.5, 4), (8, 12)]) == 4  # (2, 4) and (8, 10)
    assert overlap([(0, 1), (5, 6)], [(1, 5)]) == 0
    assert overlap([], [(0, 1)]) == 0


def test_nccl_kernels_are_communication_before_any_other_category():
    assert kernel_category(NCCL) == "nccl"
    assert kernel_category("ncclDevKernel_AllGather_RING_LL_f8e4m3") == "nccl"  # not "fp8 matmul"
    assert Kernel(NCCL, 0, 1, False).is_comm and Kernel("Memcpy DtoD", 0, 1, False).is_copy


def test_step_overlap_splits_the_reduction_into_hidden_and_exposed_time():
    kernels = [
        Kernel("triton_poi_fused_forward", 0, 20, False),
        Kernel("nvjet_sm90_tst_backward", 20, 60, True),
        Kernel(NCCL, 40, 70, True),  # starts 20 µs before the backward's last kernel ends
        Kernel("Memcpy DtoD (Device -> Device)", 60, 75, False),  # a copy is not compute
        Kernel(NCCL, 80, 90, False),  # after the backward, alone: exposed
        Kernel("triton_poi_fused_muon_update", 90, 100, False),
    ]
    s = step_overlap(kernels)
    assert s["comm_ms"] == pytest.approx(0.040)
    assert s["overlapped_ms"] == pytest.approx(0.020)
    assert s["exposed_ms"] == pytest.approx(0.020)
    assert s["comm_lead_ms"] == pytest.approx(0.020)  # 60 - 40 µs: starts inside the backward

    fsdp = step_overlap([Kernel(NCCL, 0, 5, False), *kernels])  # a forward all-gather comes first
    assert fsdp["comm_lead_ms"] == pytest.approx(0.020) and fsdp["comm_ms"] == pytest.approx(0.045)
    after = step_overlap([Kernel("gemm_backward", 0, 50, True), Kernel(NCCL, 55, 65, True)])
    assert after["comm_lead_ms"] == pytest.approx(-0.005) and after["overlapped_ms"] == 0
    none = step_overlap([Kernel("gemm", 0, 50, True)])
    assert none["comm_ms"] == 0 and none["comm_lead_ms"] is None
    assert mean_overlap([s, after, none])["comm_lead_ms"] == pytest.approx((0.020 - 0.005) / 2)


def test_kernels_go_to_the_step_they_start_in():
    ks = [Kernel("a", 1, 5, False), Kernel("b", 9, 12, False), Kernel("c", 12, 13, False), Kernel("d", 30, 31, False)]
    steps, outside = split_by_step(ks, [(0, 10), (10, 20)])
    assert [[k.name for k in s] for s in steps] == [["a", "b"], ["c"]] and outside == 1


FIXTURE = Path(__file__).parent / "fixtures" / "profile_4gpu_excerpt.json"


def test_a_real_4gpu_trace_places_compiled_kernels_and_the_reduction():
    """An excerpt of wave 8's rank-0 trace (scripts/cut_trace_fixture.py; 4 x H100, torch 2.11): the compiled
    graphs' Triton kernels, the hooks' packing and the reduce-scatters placed by the ops that launched them
    (the profiler objects placed none of its 5,562 kernels: no backward end, no reduction start)."""
    steps, outside, unlinked = profiled_steps(load_trace(FIXTURE))
    assert len(steps) == 1 and outside == 0 and unlinked == 0
    kernels = steps[0]
    phases = [(k.phase, k.backward, k.graph) for k in kernels if not k.is_comm]
    assert phases.count(("forward", False, True)) == 3
    assert phases.count(("backward", True, True)) == 3  # the compiled backward graph's last kernels
    assert phases.count(("backward", True, False)) == 1  # a bucket's packing, in a hook on the autograd thread
    assert phases.count(("optimizer DistMuon", False, False)) == 2
    comm = [(k.collective, k.backward, k.phase, k.nbytes) for k in kernels if k.is_comm]
    assert comm == [("_reduce_scatter_base", True, "backward", 77_266_944)] * 2 + [
        ("_allgather_base", False, "optimizer DistMuon", 9_437_184)]
    s = step_overlap(kernels)
    assert s["comm_lead_ms"] == pytest.approx(1.66, abs=0.005)  # starts during the hooks' packing
    graphs_end = backward_end(kernels, graphs_only=True)
    first_rs = min(k.start for k in kernels if k.is_comm)
    assert graphs_end < first_rs < backward_end(kernels)  # ... after the compiled backward graph
    text = "\n".join(trace_report(steps, outside, unlinked, each=True)[0])
    assert "+1.66 (starts inside the backward)" in text and "not linked" not in text
    assert "its compiled graphs' at 172.09" in text and "_allgather_base        x1" in text


def test_bench_profiles_a_step_through_the_trace_it_keeps_and_nests_the_backwards_ops(tmp_path, capsys):
    """bench's profile on this torch (CPU): the report read from the trace it writes, whose ops run by the
    backward nest under the engine's range, the forward's not."""
    from types import SimpleNamespace

    from speedgpt.bench import profile_steps

    layer = torch.nn.Linear(8, 8)
    trainer = SimpleNamespace(train_step=lambda s: layer(torch.randn(4, 8)).square().sum().backward(),
                              sync_device=lambda: None, dist=SimpleNamespace(is_main=True))
    mean = profile_steps(trainer, [0], rows=3, step_ms=1.0, trace=tmp_path / "profile-A.json.gz")
    out = capsys.readouterr().out
    assert f"profile trace: {tmp_path / 'profile-A.json.gz'}" in out and "step 1: no kernel" in out
    assert mean["comm_ms"] == 0 and mean["comm_lead_ms"] is None  # no GPU here: no kernel
    events = load_trace(tmp_path / "profile-A.json.gz")
    ops = list(trace_ops(events).values())
    forward = [op for op in ops if op.name == "aten::addmm"]
    backward = [op for op in ops if op.name == "aten::mm"]  # the weight's gradient
    assert forward and backward
    assert not any(op.backward for op in forward) and all(op.backward and op.phase == "backward" for op in backward)
    kernels, windows, unlinked = trace_kernels(events)
    assert kernels == [] and len(windows) == 1 and unlinked == 0


def test_an_unreadable_trace_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "t.json.gz").write_text("not gzip")
    (tmp_path / "t.json").write_text('{"traceEvents": 3}')
    with pytest.raises(ValueError, match=r"t\.json\.gz: not a readable Chrome trace"):
        load_trace(tmp_path / "t.json.gz")
    with pytest.raises(ValueError, match="no traceEvents list"):
        load_trace(tmp_path / "t.json")


def test_the_printout_says_where_the_reduction_starts():
    from speedgpt.kernel_timeline import describe_overlap

    inside = {"comm_ms": 4.0, "overlapped_ms": 3.0, "exposed_ms": 1.0, "comm_lead_ms": 2.5}
    after = dict(inside, comm_lead_ms=-1.0)
    text = "\n".join(describe_overlap([inside, after], outside=2, unlinked=0))
    assert "step 1" in text and "+2.50 (starts inside the backward)" in text and "(75%)" in text
    assert "-1.00 (starts after the backward)" in text and "mean" in text and "+0.75" in text
    assert "2 kernel(s) started outside" in text and "not linked" not in text


def test_kernel_categories_count_idle_time_against_the_time_some_kernel_runs(capsys):
    """NCCL beside compute: the categories' sum (200 ms) over-counts the busy time (150 ms); idle is the step
    minus the busy time (wave 6 printed -28.8 ms of idle from the sum)."""
    from speedgpt.bench import print_kernel_categories

    kernels = [Kernel("nvjet_sm90_tst_gemm", 0, 100_000, False), Kernel(NCCL, 50_000, 150_000, True)]
    print_kernel_categories(kernels, steps=1, step_ms=180.0)
    out = capsys.readouterr().out
    assert "total                            200.0" in out
    assert "some kernel running              150.0  (kernels at once: 50.0)" in out
    assert "(GPU idle ~30.0)" in out


def test_a_steps_compute_gaps_split_into_waits_on_nccl_and_idle_time():
    from speedgpt.step_timeline import segments, step_summary

    kernels = [Kernel("triton_fwd", 0, 10, False, phase="forward"),
               Kernel("triton_bwd", 12, 30, True, phase="backward", launched=2),  # 2 µs idle before it
               Kernel(NCCL, 28, 40, True, phase="backward", collective="_reduce_scatter_base"),
               Kernel("adam", 40, 45, False, phase="optimizer DistAdam"),  # 10 µs waiting while NCCL runs
               Kernel("ncclDevKernel_AllGather", 45, 50, False, phase="optimizer DistAdam")]  # after compute: waited
    segs = segments(kernels)
    assert [(s.phase, s.start, s.end, s.busy, s.nccl_wait, s.idle) for s in segs] == [
        ("forward", 0, 10, 10, 0, 0), ("backward", 10, 30, 18, 0, 2), ("optimizer DistAdam", 30, 45, 5, 10, 0)]
    assert segs[1].lag == 10  # the kernel started 10 µs after its launch call
    s = step_summary(kernels)
    assert s["span"] == pytest.approx(0.050) and s["busy"] == pytest.approx(0.033)
    assert s["nccl_wait"] == pytest.approx(0.015) and s["idle"] == pytest.approx(0.002)
    assert s["nccl_after"] == pytest.approx(0.005)


def test_traces_of_several_ranks_line_up_on_their_shared_clock():
    """The rank whose compiled backward ends last is the one the others wait for: its end is read on the
    clock the ranks' traces share, from the earliest step start among them."""
    from dataclasses import replace

    from speedgpt.step_timeline import compare_traces

    steps, _, _ = profiled_steps(load_trace(FIXTURE))
    late = [[replace(k, start=k.start + 1500, end=k.end + 1500) for k in steps[0]]]  # 1.5 ms behind
    lines = compare_traces([("rank0", steps), ("rank1", late)])
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert float(rows["rank1"][6]) - float(rows["rank0"][6]) == pytest.approx(1.5, abs=0.01)
    assert rows["rank0"][2] == rows["rank1"][2]  # each one's own span is the same


def test_trace_report_refuses_a_missing_path_and_a_folder_in_one_line(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "trace_report.py"
    spec = importlib.util.spec_from_file_location("trace_report", script)
    trace_report_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trace_report_cli)
    for path, what in ((tmp_path / "none.json.gz", "no such file"), (tmp_path, "a folder, not a trace file")):
        with pytest.raises(SystemExit) as e:
            trace_report_cli.main([str(path)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"{path}: {what}" in err and "Traceback" not in err
