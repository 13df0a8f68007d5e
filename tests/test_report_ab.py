"""The A/B table of `speedgpt report A B`: val loss at equal training time and at equal tokens.

Run dirs are written with the trainer's own writers (MetricsLogger, save_toml of a resolved
preset), with val curves chosen so every interpolated value is known by hand."""

import io
import json

import pytest

from speedgpt import report
from speedgpt.cli import main as cli_main
from speedgpt.config import apply_overrides, load_preset, save_toml
from speedgpt.report import compare_runs, comparison_markdown, config_diff, interpolate, load_runs
from speedgpt.rundir.metrics import MetricsLogger


def write_run(run_dir, vals, *, overrides=(), config=True, step_tokens=100):
    """A run dir as the trainer leaves it. ``vals``: (time_s, tokens, val_loss) per validation, the
    first at step 0; a train record (as log_train writes it) precedes each later validation."""
    run_dir.mkdir(parents=True)
    if config:
        cfg = apply_overrides(load_preset("tiny-cpu"), [f"--run.name={run_dir.name}", *overrides])
        save_toml(cfg, run_dir / "config.toml")
    with MetricsLogger(run_dir) as log:
        prev_t = 0.0
        for time_s, tokens, val in vals:
            step = tokens // step_tokens
            if step:
                dt = (time_s - prev_t) / max(1, step)
                log.log({"step": step, "tokens": tokens, "time_s": round(time_s, 3), "train_loss": val + 0.1,
                         "lr": 0.05, "tok_per_s": round(step_tokens / dt, 1), "step_ms": round(dt * 1e3, 2)})
            log.log({"step": step, "tokens": tokens, "time_s": time_s, "val_loss": val})
            prev_t = time_s
    return run_dir


# A: ends at 30 s / 3000 tokens. B: faster per second, ends first (24 s, 2500 tokens). C: slower.
A_VALS = [(0.0, 0, 10.0), (10.0, 1000, 6.0), (20.0, 2000, 4.0), (30.0, 3000, 3.0)]
B_VALS = [(0.0, 0, 10.0), (8.0, 1000, 5.0), (16.0, 2000, 3.6), (24.0, 2500, 3.2)]
C_VALS = [(0.0, 0, 10.0), (12.0, 1200, 5.0), (36.0, 3600, 3.0)]


@pytest.fixture
def abc(tmp_path):
    return (write_run(tmp_path / "base", A_VALS),
            write_run(tmp_path / "lr03", B_VALS, overrides=["--optim.muon_lr=0.03", "--model.depth=6"]),
            write_run(tmp_path / "slow", C_VALS, overrides=["--schedule.kind=warmup_cosine"]))


def test_interpolate():
    curve = [(0.0, 10.0), (10.0, 6.0), (20.0, 4.0)]
    assert interpolate(curve, 10.0) == 6.0
    assert interpolate(curve, 15.0) == pytest.approx(5.0)
    assert interpolate(curve, 2.5) == pytest.approx(9.0)
    assert interpolate(curve, 20.0) == 4.0 and interpolate(curve, 0.0) == 10.0
    assert interpolate(curve, 20.5) is None and interpolate(curve, -1.0) is None  # never extrapolated
    assert interpolate([(5.0, 7.0)], 5.0) is None and interpolate([], 1.0) is None and interpolate(curve, None) is None
    assert interpolate([(0.0, 9.0), (4.0, 5.0), (4.0, 4.5)], 4.0) == 4.5  # two evals at one time: the later


def test_equal_time_and_equal_tokens_numbers(abc):
    comp = compare_runs(load_runs(abc))
    assert comp["equal_time_s"] == 24.0  # B's last validation ends first
    assert comp["equal_tokens"] == 2500
    a, b, c = comp["rows"]
    assert [r["id"] for r in comp["rows"]] == ["A", "B", "C"] and a["baseline"] and a["run"] == "base"
    # at 24 s: A between (20 s, 4.0) and (30 s, 3.0); B at its end; C between (12 s, 5.0) and (36 s, 3.0)
    assert a["val_at_equal_time"] == pytest.approx(3.6)
    assert b["val_at_equal_time"] == pytest.approx(3.2)
    assert c["val_at_equal_time"] == pytest.approx(4.0)
    assert (b["delta_at_equal_time"], c["delta_at_equal_time"]) == (pytest.approx(-0.4), pytest.approx(0.4))
    # at 2500 tokens: A between (2000, 4.0) and (3000, 3.0); C between (1200, 5.0) and (3600, 3.0)
    assert a["val_at_equal_tokens"] == pytest.approx(3.5)
    assert b["val_at_equal_tokens"] == pytest.approx(3.2)
    assert c["val_at_equal_tokens"] == pytest.approx(5.0 - 2.0 * 1300 / 2400)
    assert b["delta_at_equal_tokens"] == pytest.approx(-0.3)
    assert c["delta_at_equal_tokens"] == pytest.approx(5.0 - 2.0 * 1300 / 2400 - 3.5)
    assert a["delta_at_equal_time"] == 0.0
    # The plain final numbers tell the other half: B ends worse than A, because it trained shorter.
    assert (a["final_val_loss"], b["final_val_loss"], c["final_val_loss"]) == (3.0, 3.2, 3.0)
    assert b["delta_final"] == pytest.approx(0.2) and c["delta_final"] == 0.0
    assert (a["train_time_s"], b["train_time_s"], c["train_time_s"]) == (30.0, 24.0, 36.0)
    assert a["mean_tok_per_s"] == pytest.approx(100.0) and b["mean_tok_per_s"] == pytest.approx(2500 / 24)
    # A and C are read before their ends (mid-cooldown); B is read at its end.
    assert (a["mid_run_time"], b["mid_run_time"], c["mid_run_time"]) == (True, False, True)
    assert (a["mid_run_tokens"], b["mid_run_tokens"], c["mid_run_tokens"]) == (True, False, True)
    assert any(n.startswith("* read mid-run") and "A (constant_cooldown" in n and "C (warmup_cosine)" in n
               for n in comp["notes"])


def test_config_diff_lists_resolved_keys_that_differ(abc):
    a, b, c = compare_runs(load_runs(abc))["rows"]
    assert a["overrides"] == []
    assert b["overrides"] == ["model.depth=6", "optim.muon_lr=0.03"]  # run.name differs too: not a recipe key
    assert c["overrides"] == ["schedule.kind=warmup_cosine"]
    base = {"model.depth": 4, "run.name": "a", "data.train_files": "x", "train.compile": False, "preset": "tiny-cpu"}
    other = {"model.depth": 4, "run.name": "b", "data.train_files": "my dir ", "train.compile": True,
             "model.extra": [1, "x"]}
    assert config_diff(base, other) == ['data.train_files="my dir "', "train.compile=true", "model.extra=[1, \"x\"]",
                                        "preset=(unset)"]
    assert config_diff(base, None) is None and config_diff(None, other) is None


def test_a_config_missing_keys_takes_the_defaults(tmp_path):
    # A config.toml written before a key existed: the key resolves to what a rerun would use.
    a = write_run(tmp_path / "a", A_VALS)
    b = write_run(tmp_path / "b", B_VALS, config=False)
    (b / "config.toml").write_text((a / "config.toml").read_text().replace("\ncompile = false\n", "\n"))
    assert "\ncompile = " not in (b / "config.toml").read_text()  # (train.compile_scope stays)
    assert compare_runs(load_runs([a, b]))["rows"][1]["overrides"] == []



@pytest.mark.parametrize("cut", ["empty", "cut short", "baseline cut short"])
def test_a_config_cut_short_is_unreadable_not_filled_with_defaults(tmp_path, capsys, cut):
    """(audit 29b) A run's config.toml cut short (a full disk, a copy that stopped) was read as it stood: the
    defaults stood in for its lost sections, and the overrides column named them as the run's settings
    (`data.seq_len=1024`, `train.steps=1000` beside a tiny-cpu run), with a "validated on other data" mark."""
    a = write_run(tmp_path / "a", A_VALS)
    b = write_run(tmp_path / "b", B_VALS)
    damaged = a if cut.startswith("baseline") else b
    text = (damaged / "config.toml").read_text()
    (damaged / "config.toml").write_text("" if cut == "empty" else text[:text.index("\n[data]")])
    with pytest.warns(UserWarning) as warned:  # as report's other unreadable files: one warning line, run kept
        assert cli_main(["report", str(a), str(b), "--markdown"]) == 0
    (warning,) = [str(w.message) for w in warned]
    assert f"{damaged / 'config.toml'} is " in warning and "restore it" in warning, warning
    row = capsys.readouterr().out.splitlines()[3]
    says = "A: config.toml unreadable" if damaged == a else "config.toml unreadable"
    assert row.startswith(f"| B: b | – ({says}) |") and "≠" not in row and "seq_len" not in row, row


def test_markdown_table(abc, tmp_path, capsys):
    assert cli_main(["report", *map(str, abc), "--markdown", "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "wrote" not in captured.err + captured.out  # stdout: just the table, to paste
    assert not (tmp_path / "out").exists()  # --markdown prints only, as its help says
    lines = captured.out.splitlines()
    assert lines[0] == ("| run | overrides vs A | final val | Δ final | train time | tok/s (mean) | "
                        "val @ equal time (24.0s) | Δ vs A @ equal time | val @ equal tokens (2.5K) | "
                        "Δ vs A @ equal tokens |")
    assert lines[1] == "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert lines[2] == "| A: base | (baseline) | 3.0000 | +0.0000 | 30.0s | 100 | 3.6000\\* | +0.0000 | 3.5000\\* | +0.0000 |"
    assert lines[3] == ("| B: lr03 | `model.depth=6`, `optim.muon_lr=0.03` | 3.2000 | +0.2000 | 24.0s | 104 | "
                        "3.2000 | -0.4000\\* | 3.2000 | -0.3000\\* |")
    assert lines[4].startswith("| C: slow | `schedule.kind=warmup_cosine` | 3.0000 | +0.0000 | 36.0s | 100 | 4.0000\\* |")
    assert lines[5] == "" and all(line.startswith("- ") for line in lines[6:])
    assert any(line.startswith("- \\* read mid-run") for line in lines[6:])
    # The HTML report carries the same table.
    assert cli_main(["report", *map(str, abc), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "A/B: equal training time and equal tokens" in page and "optim.muon_lr=0.03" in page
    assert "-0.4000*" in page


def test_markdown_needs_two_runs(abc, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["report", str(abc[0]), "--markdown"])
    assert e.value.code == 2 and "--markdown prints the A/B table" in capsys.readouterr().err


def test_single_point_and_no_val_runs_give_dashes(tmp_path):
    from rich.console import Console

    a = write_run(tmp_path / "a", A_VALS)
    one = write_run(tmp_path / "one", [(5.0, 500, 6.5)])  # a single validation (e.g. a crash after it)
    none = tmp_path / "none"
    with MetricsLogger(none) as log:  # train records only: val_every=0
        log.log({"step": 10, "tokens": 1000, "time_s": 9.0, "train_loss": 5.0, "lr": 0.05, "tok_per_s": 111.1,
                 "step_ms": 900.0})
    empty = tmp_path / "empty"
    MetricsLogger(empty).close()  # started, nothing logged yet
    comp = compare_runs(load_runs([a, one, none, empty]))
    assert comp["equal_time_s"] == 30.0  # runs without a curve do not set the common point
    ra, r1, rn, re_ = comp["rows"]
    assert ra["val_at_equal_time"] == 3.0 and not ra["mid_run_time"]
    for r in (r1, rn, re_):
        assert r["val_at_equal_time"] is None and r["val_at_equal_tokens"] is None
        assert r["delta_at_equal_time"] is None and r["delta_at_equal_tokens"] is None
    assert r1["final_val_loss"] == 6.5 and r1["delta_final"] == pytest.approx(3.5)
    assert rn["final_val_loss"] is None and rn["delta_final"] is None and rn["train_time_s"] == 9.0
    assert re_["train_time_s"] is None and re_["mean_tok_per_s"] is None
    assert rn["overrides"] is None and not rn["has_config"]
    md = comparison_markdown(comp).splitlines()
    assert md[3] == "| B: one | (same config) | 6.5000 | +3.5000 | 5.0s | 100 | – | – | – | – |"
    assert md[4] == "| C: none | – (no config.toml) | – | – | 9.0s | 111 | – | – | – | – |"
    assert any("B, C, D logged fewer than two val records" in line for line in md)
    console = Console(file=io.StringIO(), width=200)
    report.print_comparison(comp, console=console)
    assert "C: none" in console.file.getvalue()

    # A baseline without a curve: no deltas anywhere, the others' values still read at their common point.
    comp = compare_runs(load_runs([one, a, write_run(tmp_path / "b", B_VALS)]))
    assert comp["equal_time_s"] == 24.0
    assert [r["delta_at_equal_time"] for r in comp["rows"]] == [None, None, None]
    assert comp["rows"][1]["val_at_equal_time"] == pytest.approx(3.6)
    # Nothing to read anywhere: no common point, still a table.
    comp = compare_runs(load_runs([none, empty]))
    assert comp["equal_time_s"] is None and "(–)" in comparison_markdown(comp).splitlines()[0]
    assert report.write_report([none, one], tmp_path / "out")["html"].exists()


def test_comparison_needs_two_runs(abc):
    with pytest.raises(ValueError, match="at least two runs"):
        compare_runs(load_runs(abc[:1]))


def test_posthoc_eval_records_are_flagged(tmp_path):
    a = write_run(tmp_path / "a", A_VALS)
    b = write_run(tmp_path / "b", B_VALS)
    with MetricsLogger(b) as log:  # what `speedgpt eval` appends: its own data, at the last step
        log.log({"step": 25, "tokens": 2500, "time_s": 24.0, "event": "eval", "val_loss": 3.1, "eval_tokens": 10**7,
                 "eval_data": "data/other", "eval_split": "val"})
    comp = compare_runs(load_runs([a, b]))
    assert comp["rows"][1]["final_val_loss"] == 3.1
    assert any("B include `speedgpt eval` results" in n for n in comp["notes"])


def test_two_real_runs(tiny_cfg, tmp_path, capsys, one_thread):
    """Two short trainer runs, B with a different Muon lr: the table reads the trainer's own records."""
    from speedgpt.train.loop import train

    cfg = apply_overrides(tiny_cfg, ["--train.steps=2", "--train.val_every=1", "--train.log_every=1",
                                     "--train.batch_tokens=256", "--data.val_tokens=256"])
    train(cfg, run_dir=tmp_path / "A", quiet=True)
    train(apply_overrides(cfg, ["--optim.muon_lr=0.03"]), run_dir=tmp_path / "B", quiet=True)
    comp = compare_runs(load_runs([tmp_path / "A", tmp_path / "B"]))
    a, b = comp["rows"]
    assert b["overrides"] == ["optim.muon_lr=0.03"]
    vals = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in "AB"]
    vals = [[r for r in recs if "val_loss" in r] for recs in vals]
    assert [r["step"] for r in vals[0]] == [0, 1, 2]
    # Both runs see the same tokens: at equal tokens each is read at its last validation.
    assert comp["equal_tokens"] == 2 * cfg.train.batch_tokens
    assert (a["val_at_equal_tokens"], b["val_at_equal_tokens"]) == (vals[0][-1]["val_loss"], vals[1][-1]["val_loss"])
    assert b["delta_at_equal_tokens"] == pytest.approx(vals[1][-1]["val_loss"] - vals[0][-1]["val_loss"])
    assert comp["equal_time_s"] == min(v[-1]["time_s"] for v in vals)
    assert all(r["val_at_equal_time"] is not None for r in comp["rows"])
    assert cli_main(["report", str(tmp_path / "A"), str(tmp_path / "B"), "--markdown", "--out", str(tmp_path / "o")]) == 0
    assert "| B: B | `optim.muon_lr=0.03` |" in capsys.readouterr().out


@pytest.mark.parametrize("width", [220, 80])
def test_rich_table_and_note(abc, width):
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width)
    report.print_comparison(compare_runs(load_runs(abc)), console=console)
    out = console.file.getvalue()
    assert "-0.4000*" in out and "3.6000*" in out and "optim.muon_lr=0.03" in out
    assert "* read mid-run" in out  # the cooldown caveat sits under the table
    assert "…" not in out  # a narrow terminal gets one column per run, not squeezed cells
    header = next(line for line in out.splitlines() if "A: base" in line)
    assert ("B: lr03" in header) == (width == 80)


def test_several_runs_report_beside_the_baseline_not_in_cwd(abc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["report", *map(str, abc)]) == 0
    assert not (tmp_path / "speedgpt-report").exists()
    assert (abc[0] / "compare" / "report.html").is_file() and (abc[0] / "compare" / "report.png").is_file()


def test_runs_validated_on_other_data_are_flagged_not_compared_silently(tmp_path):
    """`speedgpt report A B` of runs on two corpora set their val losses side by side with a Δ, as if one were better:
    only the overrides column's data.train_files=... hinted that the losses were measured on other text."""
    a = write_run(tmp_path / "a", A_VALS)
    b = write_run(tmp_path / "b", B_VALS, overrides=["--data.train_files=data/other"])
    c = write_run(tmp_path / "c", C_VALS, overrides=["--data.val_tokens=4096", "--data.seq_len=256"])
    d = write_run(tmp_path / "d", B_VALS, overrides=["--optim.muon_lr=0.03"])  # a recipe change: comparable
    comp = compare_runs(load_runs([a, b, c, d]))
    assert [r["other_val_data"] for r in comp["rows"]] == [[], ["data.train_files"],
                                                           ["data.val_tokens", "data.val_seq_len"], []]
    assert any(n.startswith("≠ validated on other data than A: B (data.train_files); C (data.val_tokens, "
                            "data.val_seq_len)") for n in comp["notes"])
    md = comparison_markdown(comp).splitlines()
    assert md[3].startswith("| B: b |") and "+0.2000≠" in md[3] and "-0.4000\\*≠" in md[3]
    assert "≠" not in md[5] and "≠" not in md[2]
