"""Where compile time goes (speedgpt/train/compile_breakdown.py, issue 33): torch's own timers read into phases
that add up to the compile time, a timer this torch does not name read as missing (n/a), never as 0, and the
figures in the start log, the metrics record and `speedgpt bench`'s table. The presets' real warmups are checked
in tests/test_compile_graphs.py (their breakdowns beside their pinned graphs)."""

from __future__ import annotations

import json

import pytest
import torch

from speedgpt.bench import compile_rows, format_results
from speedgpt.train import compile_breakdown
from speedgpt.train.compile_breakdown import COUNTERS, PHASES, TIMERS, names, phases
from speedgpt.train.compile_watch import CompileWatch


@pytest.fixture
def watch():
    """A CompileWatch over an emptied dynamo; closed, and dynamo emptied again, after the test."""
    torch._dynamo.reset()
    compile_watch = CompileWatch()
    yield compile_watch
    compile_watch.close()
    torch._dynamo.reset()


def check_breakdown(b: dict, wall_s: float | None = None) -> None:
    """Every phase present and >= 0, their sum no more than the compile time (no more than the wall time)."""
    seconds = [b[f"{name}_s"] for name in PHASES]
    assert None not in seconds, b
    assert min(seconds) >= 0 and b["first_call_autotune_s"] >= 0, b
    assert sum(seconds) <= b["compile_s"] + 1e-9, b
    if wall_s is not None:
        assert b["compile_s"] <= wall_s, b


def test_this_torch_names_every_timer_and_counter():
    """The keys are torch internals (checked against torch 2.11's and 2.13's sources): a torch that renames
    one fails here instead of reading n/a in every run's log."""
    version = tuple(int(part) for part in torch.__version__.split(".")[:2])
    missing = [t.key for timers in TIMERS.values() for t in timers
               if t.since <= version and not names(t.key, t.source, t.suffix)]
    missing += [name for _, name, source in COUNTERS.values() if not names(name, source)]
    assert missing == []
    # the slowest kernel compiles (compile_watch.py): read from torch's compile records, silently empty without them
    import dataclasses

    from torch._dynamo.utils import CompilationMetrics, get_compilation_metrics  # noqa: F401  (the reader's source)

    assert {"triton_kernel_compile_times_us", "compile_id", "is_forward"} <= {
        f.name for f in dataclasses.fields(CompilationMetrics)}
    assert names("triton_kernel_compile_times_us", "_inductor/async_compile.py")


def test_phases_subtract_the_timers_nested_inside_them():
    # a frame of 10 s whose backend call took 8 s, a backward compile of 3 s; Inductor 7 s inside those, in
    # which 4 s waiting for kernels and 1 s autotuning; 0.5 s autotuning at first launch, after the compile
    raw = {"frame": 10.0, "backward": 3.0, "backend": 8.0, "inductor": 7.0, "kernels": 4.0, "autotune": 1.0,
           "first_call_autotune": 0.5, "fx_cache_hits": 2.0, "fx_cache_misses": 3.0, "aot_cache_hits": 0.0,
           "aot_cache_misses": 1.0}
    p = phases(raw)
    assert (p["compile_s"], p["trace_s"], p["aot_s"], p["inductor_s"], p["kernels_s"], p["autotune_s"]) == \
        (13.0, 2.0, 4.0, 2.0, 4.0, 1.0)
    assert p["first_call_autotune_s"] == 0.5 and (p["fx_cache_hits"], p["fx_cache_misses"]) == (2, 3)
    line = compile_breakdown.describe(p)
    assert line == ("trace 2.0, aot 4.0, inductor 2.0, kernels 4.0, autotune 1.0 s; first-call autotune 0.5 s; "
                    "fx graph cache 2/5 hits, aot autograd cache 0/1 hits")
    # a torch without kernel timers: kernels read n/a and their seconds stay in Inductor's; without a backend
    # timer trace and aot cannot be told apart
    p = phases(dict(raw, kernels=None, backend=None, fx_cache_hits=None))
    assert (p["kernels_s"], p["inductor_s"], p["trace_s"], p["aot_s"]) == (None, 6.0, None, None)
    assert "kernels n/a" in compile_breakdown.describe(p) and "fx graph cache n/a" in compile_breakdown.describe(p)


def test_a_timer_this_torch_does_not_name_reads_missing_not_zero(monkeypatch, watch):
    """A real compile (aot_eager: dynamo and AOTAutograd without code generation), with torch's backend timer
    hidden as an older or newer torch might lack it: trace and aot read None and n/a, the rest still add up."""
    hidden = TIMERS["backend"][0].key
    real = compile_breakdown.names
    monkeypatch.setattr(compile_breakdown, "names", lambda key, *a, **kw: key != hidden and real(key, *a, **kw))
    f = torch.compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager", dynamic=False)
    with watch.span("training"):
        f(torch.ones(3, requires_grad=True)).backward()
    (span,) = watch.spans
    b = span.breakdown()
    assert b["compile_s"] > 0 and (b["trace_s"], b["aot_s"]) == (None, None)
    assert [b[f"{name}_s"] for name in ("inductor", "kernels", "autotune")] == [0.0, 0.0, 0.0]  # none ran
    assert "trace n/a, aot n/a" in watch.lines()[1]
    assert watch.record()["trace_s"] is None and watch.record()["compile_s"] > 0


def test_spans_split_training_and_validation_and_report_them(watch):
    f = torch.compile(lambda x: (x.sin() * 2).sum(), backend="aot_eager", dynamic=False)
    x = torch.ones(3, requires_grad=True)
    with watch.span("training"):
        f(x).backward()
    with watch.span("validation"), torch.no_grad():
        f(x)
    training, validation = watch.spans
    for span in (training, validation, watch.total()):
        check_breakdown(span.breakdown(), span.wall_s)
    assert training.breakdown()["aot_s"] > 0 and validation.breakdown()["compile_s"] > 0
    total = watch.total().breakdown()
    assert total["compile_s"] == pytest.approx(training.compile_s + validation.compile_s)
    lines = watch.lines()
    assert lines[1].startswith("  compile time: trace ") and "fx graph cache 0/0 hits" in lines[1]
    assert lines[2].startswith("  training: 1 graph(s)") and "(trace " in lines[2]
    record = watch.record()
    assert set(record) >= {f"{name}_s" for name in PHASES} | set(COUNTERS) | {"first_call_autotune_s"}
    assert [s["label"] for s in record["spans"]] == ["training", "validation"]
    assert record["spans"][1]["aot_s"] == round(validation.breakdown()["aot_s"], 3)


def test_bench_rows_show_each_phase_and_cache_and_n_a_as_a_dash():
    record = {"graphs": 2, "recompiles": 1, "compile_s": 13.0, "trace_s": 2.0, "aot_s": 4.0, "inductor_s": 2.0,
              "kernels_s": None, "autotune_s": 1.0, "first_call_autotune_s": 0.5, "fx_cache_hits": 2,
              "fx_cache_misses": 3, "aot_cache_hits": None, "aot_cache_misses": None}
    rows = compile_rows(record)
    assert rows["compile_trace_s"] == 2.0 and rows["compile_fx_cache_hits"] == "2/5"
    assert rows["compile_kernels_s"] is None and rows["compile_aot_cache_hits"] is None
    table = format_results([("A", dict(rows, tok_per_s=1.0, world_size=1))], None).splitlines()
    row = {line.split()[0]: line.split()[1] for line in table[1:] if len(line.split()) == 2}
    assert row["compile_trace_s"] == "2.000" and row["compile_first_call_autotune_s"] == "0.500"
    assert row["compile_fx_cache_hits"] == "2/5" and "compile_kernels_s" not in row  # n/a: a row of "-" only


def test_the_slowest_kernel_compiles_come_from_torchs_record_of_each_compile_in_the_span(monkeypatch, watch):
    """Each compile's list of its slowest Triton kernels (torch's CompilationMetrics, JSON [[name, us], ...]): a
    span takes the compiles made inside it (not those before; all of the bounded list if it dropped the span's
    newest), a kernel is named with its compile (names restart in every graph; " bwd" for a lazy backward), a
    list torch could not serialize or of another shape is skipped, and the log line, the record and the spans'
    records show the slowest."""
    from types import SimpleNamespace

    from speedgpt.train import compile_watch

    def event(i, kernels, forward=True):
        return SimpleNamespace(compile_id=f"0/{i}", is_forward=forward,
                               triton_kernel_compile_times_us=kernels if kernels is None or isinstance(kernels, str)
                               else json.dumps(kernels))

    before = event(0, [["triton_tem_fused_flex_attention_backward_0", 30_000_000]])  # an earlier compile
    forward = event(1, [["triton_tem_fused_flex_attention_0", 12_500_000], ["triton_poi_fused_add_1", 400_000]])
    backward = event(1, [["triton_tem_fused_flex_attention_backward_2", 21_000_000],
                         ["triton_poi_fused_add_1", 900_000]], forward=False)
    events = [before]
    monkeypatch.setattr(compile_watch, "compile_events", lambda: list(events))
    with watch.span("training"):
        events += [forward, backward, event(3, "<unknown>"), event(4, None), event(6, '{"a": 1}'),
                   event(7, '[["x", 1, 2]]')]
    with watch.span("validation"):
        events.append(event(5, [["triton_tem_fused_flex_attention_3", 9_000_000]]))
    with watch.span("after the warmup"):  # torch's list (bounded) dropped every record the span started with
        events[:] = [event(8, [["triton_red_fused_sum_0", 2_000_000]])]
    training, validation, after = watch.spans
    assert training.kernel_compile_s == {
        "triton_tem_fused_flex_attention_backward_2 [0/1 bwd]": 21.0,
        "triton_tem_fused_flex_attention_0 [0/1]": 12.5, "triton_poi_fused_add_1 [0/1 bwd]": 0.9,
        "triton_poi_fused_add_1 [0/1]": 0.4}
    assert validation.kernel_compile_s == {"triton_tem_fused_flex_attention_3 [0/5]": 9.0}
    assert after.kernel_compile_s == {"triton_red_fused_sum_0 [0/8]": 2.0}
    line = next(ln for ln in watch.lines() if "slowest kernel compiles" in ln)
    assert line.endswith("triton_tem_fused_flex_attention_backward_2 [0/1 bwd] 21.0s, "
                         "triton_tem_fused_flex_attention_0 [0/1] 12.5s, triton_tem_fused_flex_attention_3 "
                         "[0/5] 9.0s, triton_red_fused_sum_0 [0/8] 2.0s, triton_poi_fused_add_1 [0/1 bwd] 0.9s")
    record = watch.record()
    assert record["slowest_kernels"][0] == ["triton_tem_fused_flex_attention_backward_2 [0/1 bwd]", 21.0]
    assert len(record["slowest_kernels"]) == 6 and record["spans"][1]["slowest_kernels"] == [
        ["triton_tem_fused_flex_attention_3 [0/5]", 9.0]]


def test_no_kernel_line_where_torch_recorded_no_triton_kernel(watch):
    """On a CPU (no Triton) the compiles list no kernels: no line, an empty list in the record."""
    from speedgpt.train.compile_watch import compile_events

    newest = (compile_events() or [None])[-1]
    with watch.span("training"):
        torch.compile(lambda x: (x.sin() * 2).sum(), backend="inductor", dynamic=False)(torch.ones(3))
    seen = compile_events()
    assert seen and seen[-1] is not newest and hasattr(seen[-1], "triton_kernel_compile_times_us")
    assert not any("slowest kernel" in ln for ln in watch.lines())
    assert watch.record()["slowest_kernels"] == []
