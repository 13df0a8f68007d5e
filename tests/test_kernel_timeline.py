"""The communication-against-compute arithmetic of `bench --profile` (speedgpt/kernel_timeline.py)
on synthetic kernel spans, the reading of profiler events (fake GPU events; the CPU side from a
real CPU profile), without a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from speedgpt.kernel_timeline import (STEP_RANGE, Kernel, covered, kernel_category, mean_overlap, merged, overlap,
                                      profiled_steps, split_by_step, step_overlap)

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


@dataclass
class Range:
    start: float
    end: float


@dataclass
class FakeEvent:
    """The attributes of torch.autograd.profiler_util.FunctionEvent that kernel_timeline reads."""

    name: str
    device_type: object
    time_range: Range
    id: int = 0
    linked_correlation_id: int = 0
    cpu_parent: "FakeEvent | None" = None
    is_async: bool = False
    is_user_annotation: bool = False
    children: list = field(default_factory=list)


class FakeProfile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_profiled_steps_links_kernels_to_backward_ops_and_skips_gpu_annotations():
    CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    step1, step2 = FakeEvent(STEP_RANGE, CPU, Range(0, 100)), FakeEvent(STEP_RANGE, CPU, Range(100, 200))
    fwd = FakeEvent("aten::mm", CPU, Range(1, 2), id=5)
    engine = FakeEvent("autograd::engine::evaluate_function: CompiledFunctionBackward", CPU, Range(3, 9), id=9)
    bwd = FakeEvent("triton_launch", CPU, Range(4, 5), id=11, cpu_parent=engine)
    hook = FakeEvent("c10d::reduce_scatter_", CPU, Range(6, 7), id=12, cpu_parent=engine)
    launch = FakeEvent("cudaLaunchKernel", CPU, Range(4, 5), id=5, linked_correlation_id=11)  # runtime: not an op
    events = [step1, step2, fwd, engine, bwd, hook, launch,
              FakeEvent("triton_fwd", CUDA, Range(10, 30), linked_correlation_id=5),
              FakeEvent("triton_bwd", CUDA, Range(30, 60), linked_correlation_id=11),
              FakeEvent(NCCL, CUDA, Range(40, 70), linked_correlation_id=12),
              FakeEvent("## Call CompiledFxGraph ##", CUDA, Range(10, 60), is_user_annotation=True),
              FakeEvent(STEP_RANGE, CUDA, Range(10, 70)),
              FakeEvent("triton_next_step", CUDA, Range(120, 130), linked_correlation_id=99)]  # unlinked
    steps, outside, unlinked = profiled_steps(FakeProfile(events))
    assert unlinked == 1 and outside == 0
    assert [(k.name, k.backward) for k in steps[0]] == [("triton_fwd", False), ("triton_bwd", True), (NCCL, True)]
    assert [(k.name, k.backward) for k in steps[1]] == [("triton_next_step", False)]
    s = step_overlap(steps[0])
    assert s["comm_ms"] == pytest.approx(0.030) and s["overlapped_ms"] == pytest.approx(0.020)
    assert s["comm_lead_ms"] == pytest.approx(0.020)


def test_compiled_graphs_kernels_are_placed_by_their_graphs_gpu_span():
    """Inductor's Triton kernels link to no op (5,562 of them in wave 6's 4-GPU profile): the GPU span of the
    graph call they ran in says whether they are the backward's."""
    CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    fwd_graph, bwd_graph = "## Call CompiledFxGraph f6x ##", "## Call CompiledFxGraph fv3 ##"
    engine = FakeEvent("autograd::engine::evaluate_function: CompiledFunctionBackward", CPU, Range(3, 9), id=9)
    hook = FakeEvent("record_param_comms", CPU, Range(6, 7), id=12, cpu_parent=engine)
    events = [FakeEvent(STEP_RANGE, CPU, Range(0, 100)), engine, hook,
              FakeEvent(fwd_graph, CPU, Range(1, 2), id=3),
              FakeEvent(bwd_graph, CPU, Range(4, 8), id=4, cpu_parent=engine),
              FakeEvent(fwd_graph, CUDA, Range(10, 30), is_user_annotation=True),
              FakeEvent(bwd_graph, CUDA, Range(30, 60), is_user_annotation=True),
              FakeEvent("triton_poi_fused_0", CUDA, Range(10, 30)),
              FakeEvent("triton_red_fused_1", CUDA, Range(30, 45)),
              FakeEvent("triton_per_fused_2", CUDA, Range(45, 60)),
              FakeEvent(NCCL, CUDA, Range(50, 80), linked_correlation_id=12),
              FakeEvent("triton_optimizer_step", CUDA, Range(80, 90))]  # in no graph: unplaced
    steps, outside, unlinked = profiled_steps(FakeProfile(events))
    assert unlinked == 1 and outside == 0
    assert [(k.name, k.backward) for k in steps[0]] == [
        ("triton_poi_fused_0", False), ("triton_red_fused_1", True), ("triton_per_fused_2", True), (NCCL, True),
        ("triton_optimizer_step", False)]
    assert step_overlap(steps[0])["comm_lead_ms"] == pytest.approx(0.010)  # the reduction starts 10 µs early
    # a graph that also runs outside the backward (a name seen in both) places nothing as the backward's
    events.append(FakeEvent(bwd_graph, CPU, Range(95, 96), id=7))
    steps, _, _ = profiled_steps(FakeProfile(events))
    assert not any(k.backward for k in steps[0] if k.name.startswith("triton"))


def test_a_real_profile_marks_the_autograd_engines_ops_as_backward():
    """The CPU half of the linking on this torch: ops run by the backward sit under the engine's range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from speedgpt.kernel_timeline import _is_backward

    layer, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function(STEP_RANGE):
            layer(x).square().sum().backward()
    events = prof.events()
    assert [e.name for e in events].count(STEP_RANGE) == 1
    forward = [e for e in events if e.name == "aten::addmm"]
    backward = [e for e in events if e.name == "aten::mm"]  # the weight's gradient
    assert forward and backward
    assert not any(_is_backward(e) for e in forward) and all(_is_backward(e) for e in backward)


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

    CUDA = torch.autograd.DeviceType.CUDA
    kernels = [FakeEvent("nvjet_sm90_tst_gemm", CUDA, Range(0, 100_000)), FakeEvent(NCCL, CUDA, Range(50_000, 150_000))]
    for k in kernels:
        k.device_time_total = k.time_range.end - k.time_range.start
    print_kernel_categories(FakeProfile(kernels), steps=1, step_ms=180.0)
    out = capsys.readouterr().out
    assert "total                            200.0" in out
    assert "some kernel running              150.0  (kernels at once: 50.0)" in out
    assert "(GPU idle ~30.0)" in out
