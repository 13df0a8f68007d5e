import base64
import contextlib
import html
import io
import json
import math
import random
from pathlib import Path

import pytest

from speedgpt import report
from speedgpt.cli import main as cli_main
from speedgpt.config import config_from_dict, save_toml
from speedgpt.report import format_rows, print_summary, summary_table, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(run_dir, name=None, *, steps=1750, tokens_per_step=393_216, step_s=0.1, speed=1.0,
             val_every=125, seed=0, with_val=True, gpu=True):
    """A run dir whose curves look like a speedrun: power-law loss decay, noisy train loss,
    constant-then-linear-cooldown lr, throughput with jitter. ``speed`` > 1 learns faster per token."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    if name is not None:  # whole, as train writes it (a config.toml that lacks a section is a damaged one)
        save_toml(config_from_dict({"model": {"depth": 12}, "run": {"name": name}}), run_dir / "config.toml")

    def loss(step):
        return 3.0 + 7.8 * (1 + speed * step / 10) ** -0.66

    lines = []
    for step in range(1, steps + 1):
        t, tok = step * step_s * (1 + 0.02 * math.sin(step)), step * tokens_per_step
        frac = step / steps
        lr = 0.05 * (1.0 if frac < 0.55 else (1 - frac) / 0.45 * 0.9 + 0.1)
        rec = {"step": step, "tokens": tok, "time_s": t, "train_loss": loss(step) + rng.gauss(0, 0.04),
               "lr": lr, "tok_per_s": tokens_per_step / step_s * rng.uniform(0.95, 1.02), "step_ms": 1000 * step_s}
        if gpu:
            rec |= {"peak_mem_gib": 33.5, "mfu": 0.46 * rng.uniform(0.97, 1.01)}
        lines.append(rec)
        if with_val and (step % val_every == 0 or step == steps):
            lines.append({"step": step, "tokens": tok, "time_s": t, "val_loss": loss(step) + 0.02, "event": "eval"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def write_lines(run_dir, lines):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def test_write_report_two_runs(tmp_path):
    a = make_run(tmp_path / "a", "baseline", steps=600)
    b = make_run(tmp_path / "b", "muon-fast", steps=500, speed=1.6, step_s=0.11, seed=1)
    paths = write_report([a, b], tmp_path / "out", target_loss=3.4)
    png = paths["png"].read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 20_000
    page = paths["html"].read_text()
    # Self-contained: the very same PNG is embedded, and the table is real HTML.
    assert base64.b64encode(png).decode() in page
    assert "<table>" in page and "baseline" in page and "muon-fast" in page and "time to 3.4" in page
    assert 'name = &quot;baseline&quot;' in page  # config folded in, escaped
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.png"]  # no temp files


def test_summary_table_numbers(tmp_path):
    lines = [
        {"step": 1, "tokens": 100, "time_s": 1.0, "train_loss": 9.0, "lr": 1.0, "tok_per_s": 100.0, "mfu": 0.1},
        {"step": 2, "tokens": 200, "time_s": 2.0, "train_loss": 5.0, "lr": 1.0, "tok_per_s": 300.0, "mfu": 0.3,
         "peak_mem_gib": 2.0},
        {"step": 2, "tokens": 200, "time_s": 2.0, "val_loss": 4.0},
        {"step": 3, "tokens": 300, "time_s": 3.0, "train_loss": 4.0, "lr": 0.5, "tok_per_s": 200.0, "mfu": 0.2,
         "peak_mem_gib": 3.0},
        {"step": 3, "tokens": 300, "time_s": 3.0, "val_loss": 3.5},
        {"step": 4, "tokens": 400, "time_s": 4.5, "val_loss": 3.6},
    ]
    (row,) = summary_table([write_lines(tmp_path / "r", lines)], target_loss=3.7)
    assert row["run"] == "r"
    assert (row["final_val_loss"], row["best_val_loss"], row["best_val_step"]) == (3.6, 3.5, 3)
    assert (row["steps"], row["tokens"], row["wall_time_s"]) == (4, 400, 4.5)
    # 3.7 is crossed 0.6 of the way from the eval at step 2 (4.0) to the one at step 3 (3.5).
    assert (row["time_to_target_s"], row["tokens_to_target"], row["steps_to_target"]) == pytest.approx((2.6, 260, 2.6))
    assert row["median_tok_per_s"] == 200.0 and row["median_mfu"] == pytest.approx(0.2)
    assert row["peak_mem_gib"] == 3.0
    (row,) = summary_table([tmp_path / "r"], target_loss=3.0)
    assert not row["target_reached"] and row["time_to_target_s"] is None
    headers, (cells,) = format_rows([row])
    assert cells[headers.index("time to 3")] == "not reached"


def test_resumed_run_uses_the_later_lines(tmp_path):
    lines = [{"step": s, "tokens": s * 10, "time_s": float(s), "val_loss": 5.0 - s} for s in (1, 2, 3)]
    lines += [{"step": 2, "tokens": 20, "time_s": 2.0, "event": "resume"},
              {"step": 3, "tokens": 30, "time_s": 3.5, "val_loss": 1.5}]
    (row,) = summary_table([write_lines(tmp_path / "r", lines)])
    assert row["final_val_loss"] == 1.5 and row["wall_time_s"] == 3.5


def test_cpu_run_without_val_or_optional_fields(tmp_path):
    run = make_run(tmp_path / "cpu", "tiny-cpu", steps=30, with_val=False, gpu=False)
    paths = write_report([run], run)  # the trainer's call: report into the run dir itself
    assert paths["png"].read_bytes().startswith(PNG_MAGIC)
    (row,) = summary_table([run], target_loss=3.0)
    assert row["final_val_loss"] is None and row["median_mfu"] is None and row["peak_mem_gib"] is None
    assert not row["target_reached"]
    _, (cells,) = format_rows([row])
    assert cells[1] == "–" and cells[-1] == "–" and cells[-2] == "–"


def test_single_point_and_empty_metrics(tmp_path):
    one = write_lines(tmp_path / "one", [{"step": 1, "tokens": 10, "time_s": 0.1, "val_loss": 7.0}])
    empty = write_lines(tmp_path / "empty", [])
    paths = write_report([one, empty], tmp_path / "out")
    assert paths["png"].read_bytes().startswith(PNG_MAGIC)
    rows = summary_table([one, empty])
    assert rows[0]["final_val_loss"] == 7.0 and rows[1]["steps"] is None


def test_missing_metrics_file_is_a_clear_error(tmp_path):
    (tmp_path / "norun").mkdir()
    with pytest.raises(FileNotFoundError, match=r"norun[/\\]metrics.jsonl"):
        write_report([tmp_path / "norun"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="at least one RUN_DIR"):
        write_report([], tmp_path / "out")


def test_duplicate_names_get_distinct_labels(tmp_path):
    a = make_run(tmp_path / "a", "same", steps=10)
    b = make_run(tmp_path / "b", "same", steps=10)
    labels = [r["run"] for r in summary_table([a, b])]
    assert len(set(labels)) == 2 and all(label.startswith("same") for label in labels)


@pytest.mark.parametrize("width", [200, 80])
def test_print_summary_renders_with_rich(tmp_path, width):
    from rich.console import Console

    a = make_run(tmp_path / "a", "printed-a", steps=250)
    b = make_run(tmp_path / "b", "printed-b", steps=250, seed=3)
    console = Console(file=io.StringIO(), width=width)
    print_summary([a, b], target_loss=5.0, console=console)
    out = console.file.getvalue()
    assert "printed-a" in out and "printed-b" in out and "time to 5" in out and "45." in out  # MFU ~45.5 %
    assert "…" not in out  # nothing squeezed away: a narrow terminal gets one column per run
    lines = [line for line in out.splitlines() if "printed-a" in line]
    # wide: one row per run; narrow: both names share the header row
    assert ("printed-b" in lines[0]) == (width == 80)


def test_cli_main_defaults_to_the_run_dir(tmp_path, capsys):
    run = make_run(tmp_path / "r", "cli", steps=130)
    assert cli_main(["report", str(run), "--target-loss", "4.5"]) == 0
    assert (run / "report.png").exists() and (run / "report.html").exists()
    assert "wrote" in capsys.readouterr().out


def test_import_is_cheap_and_side_effect_free(tmp_path):
    import subprocess
    import sys

    code = ("import sys, speedgpt.report, speedgpt.rundir.metrics; "
            "print(sorted(m for m in ('matplotlib', 'rich', 'torch', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(Path(report.__file__).parents[2])})
    assert out.stdout.strip() == "[]" and list(tmp_path.iterdir()) == []


def test_empty_panels_are_labelled_not_drawn(tmp_path, monkeypatch):
    import matplotlib.figure

    from speedgpt.report import load_runs, plot_runs

    seen = {}
    orig = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):  # look at the axes just before they are rendered
        for ax in fig.axes:
            drawn = sum(len(line.get_xdata()) > 0 for line in ax.get_lines())
            seen[ax.get_title()] = ([t.get_text() for t in ax.texts], drawn)
        return orig(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    run = make_run(tmp_path / "cpu", "no-val", steps=10, with_val=False, gpu=False)
    plot_runs(load_runs([run]), tmp_path / "p.png", target_loss=3.0)
    assert seen["val loss vs tokens"] == (["no val_loss lines in metrics.jsonl"], 0)  # no target line either
    assert seen["loss vs step"] == (["target 3"], 2)  # train curve + target line


def test_bench_kernel_categories_of_the_speedrun_kernels():
    from speedgpt.bench import kernel_category

    assert kernel_category("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT") == "fp8 matmul"
    assert kernel_category("nvjet_sm90_qrsss_128x160_128x5_1x2_h_bz_coopA_algo2_") == "fp8 matmul"
    assert kernel_category("nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_splitK_NTN") == "matmul"
    assert kernel_category("_relu2_fp8_bwd_kernel") == "relu² + fp8 casts (ours)"
    assert kernel_category("_softcap_ce_fp8_grad_fast_kernel") == "cross-entropy (ours)"
    assert kernel_category("triton_tem_fused__unsafe_view_flex_attention_backward_1") == "flex attention"
    assert kernel_category("triton_red_fused__fused_rms_norm__to_copy_11") == "triton fused (inductor)"


def test_report_out_on_a_file_is_one_line(tmp_path, capsys):
    """--out naming a file gave '[Errno 17] File exists', exit 1."""
    from speedgpt.cli import main

    (tmp_path / "afile").write_text("mine")
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "afile")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file; pass a directory" in err[0]
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("lines", ["", "garbage\n{\"no\": \"step\"}\n"])
def test_a_run_with_nothing_to_report_is_one_line(lines, tmp_path, capsys):
    """It wrote a page of "–" cells and empty panels, exit 0."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(lines)
    with pytest.warns(UserWarning) if lines else contextlib.nullcontext():
        assert cli_main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"speedgpt report: error: {run}: its metrics.jsonl holds no readable record (the run logged no step "
                   f"yet, or every line is unreadable); report it once it has trained a step"]
    assert not (run / "report.png").exists() and not (run / "report.html").exists()


def test_a_skipped_metrics_line_is_one_warning_line(tmp_path):
    """It printed as Python's "speedgpt/rundir/metrics.py:210: UserWarning: ..." and the source line under it."""
    import subprocess
    import sys

    run = make_run(tmp_path / "r", "warned", steps=130)
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 131, "train_lo')  # a crash mid-write
    out = subprocess.run([sys.executable, "-m", "speedgpt", "report", str(run)], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": str(Path(report.__file__).parents[2])})
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [f"speedgpt report: warning: {run / 'metrics.jsonl'}: skipped 1 unreadable "
                                       f"line(s) (line {lines + 1}); likely a crash mid-write"], out.stderr


def test_an_sft_run_reports_its_held_out_loss(tmp_path, capsys):
    """An SFT run logs no val loss: its table's val cells are empty, and its held-out evaluations are said below."""
    run = write_lines(tmp_path / "sft", [
        {"event": "sft_eval", "step": 0, "heldout_loss": 10.5, "chatcore": 0.0},
        {"step": 3, "train_loss": 8.1, "time_s": 2.3},
        {"event": "sft_eval", "step": 3, "heldout_loss": 6.75, "chatcore": 0.125}])
    assert cli_main(["report", str(run)]) == 0
    said = "sft: SFT run, held-out assistant loss 10.5000 @0 -> 6.7500 @3, ChatCORE +0.125"
    assert said in capsys.readouterr().out and html.escape(said) in (run / "report.html").read_text()


def test_report_out_on_another_run_is_refused(tmp_path, capsys):
    """`report A B --out C` replaced run C's own report.png and report.html."""
    a, b, c = (make_run(tmp_path / n, n, steps=130) for n in "abc")
    assert cli_main(["report", str(c)]) == 0
    mine = (c / "report.html").read_text()
    capsys.readouterr()
    assert cli_main(["report", str(a), str(b), "--out", str(c)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {c} holds another run" in err[0] and f"({a / 'compare'})" in err[0]
    assert (c / "report.html").read_text() == mine
    assert cli_main(["report", str(a), str(b), "--out", str(a)]) == 0  # one of the runs reported: its own choice
    assert cli_main(["report", str(a), str(b), "--out", str(tmp_path / "new")]) == 0


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_a_target_loss_no_run_can_reach_is_refused(tmp_path, capsys, value):
    """`report RUN --target-loss nan` (or -1) printed "not reached" for every run and exited 0."""
    run = make_run(tmp_path / "r", "cli", steps=130)
    with pytest.raises(SystemExit) as e:
        cli_main(["report", str(run), f"--target-loss={value}"])
    assert e.value.code == 2
    assert "give a finite validation loss > 0" in capsys.readouterr().err
    assert not (run / "report.png").exists()
