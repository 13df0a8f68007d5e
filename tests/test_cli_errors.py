"""Every command fails loudly and briefly: a missing path, an empty folder or a file of the wrong
type gives one line on stderr and a non-zero status, never a traceback; Ctrl-C gives "interrupted"
and 130; nonsense arguments are refused."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_OVERRIDES
from speedgpt import cli
from speedgpt.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

# Each command with PATH where the path under test goes (inputs; for output-only commands, --out).
COMMANDS = {
    "train-data": ["train", "--train.device=cpu", "--data.train_files=PATH", "--run-dir", "RUN"],
    "train-config": ["train", "--config", "PATH"],
    "train-resume": ["train", "--resume", "PATH"],
    "data-tokenize": ["data", "tokenize", "PATH", "--out", "OUT", "--workers", "1"],
    "eval": ["eval", "PATH", "--device", "cpu"],
    "sample": ["sample", "PATH", "--prompt", "x", "--device", "cpu"],
    "export": ["export", "PATH"],
    "report": ["report", "PATH"],
    "report-ab": ["report", "PATH", "PATH"],
    "bench": ["bench", "--config", "PATH"],
    "config": ["config", "--config", "PATH"],
    "sweep-analyze": ["sweep", "--out", "PATH", "--analyze"],
}
# Commands whose path is only an output: a missing or empty folder is fine there, a file is not.
OUTPUT_ONLY = {
    "data-local-python": ["data", "local-python", "--out", "PATH", "--max-tokens", "1000", "--workers", "1"],
    "data-fineweb": ["data", "fineweb", "--out", "PATH", "--shards", "1", "--endpoint", "http://127.0.0.1:9"],
    "train-run-dir": ["train", "--train.device=cpu", "--run-dir", "PATH"],
}


def make_path(tmp_path, kind):
    if kind == "missing":
        return tmp_path / "no-such-thing"
    if kind == "empty-folder":
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty"
    path = tmp_path / "wrong.bin"  # binary junk: not a run, not shards, not text, not TOML
    path.write_bytes(b"\x00\x01\x02junk\xff\xfe" * 10)
    return path


def expect_one_line_error(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.strip().splitlines() if not line.startswith("tokenizing (")]  # progress bar
    assert rc != 0, (argv, out, err)
    assert "Traceback" not in out + err
    assert len(lines) == 1 and lines[0].startswith("speedgpt"), err
    return lines[0]


@pytest.mark.parametrize("kind", ["missing", "empty-folder", "wrong-type-file"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_path_is_a_one_line_error(command, kind, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # anything a command writes by default stays in tmp_path
    path = make_path(tmp_path, kind)
    argv = [str(path) if a == "PATH" else str(tmp_path / "run") if a == "RUN" else
            str(tmp_path / "out") if a == "OUT" else a for a in COMMANDS[command]]
    expect_one_line_error(argv, capsys)


@pytest.mark.parametrize("command", list(OUTPUT_ONLY))
def test_output_path_that_is_a_file_is_a_one_line_error(command, tmp_path, capsys):
    path = make_path(tmp_path, "wrong-type-file")
    line = expect_one_line_error([str(path) if a == "PATH" else a for a in OUTPUT_ONLY[command]], capsys)
    assert "is a file" in line


def test_run_dir_under_a_file_is_a_one_line_error_before_training(tmp_path, monkeypatch, capsys):
    """Was "[Errno 20] Not a directory" (and "[Errno 17] File exists" for the default runs/), naming no fix."""
    path = make_path(tmp_path, "wrong-type-file")
    line = expect_one_line_error(["train", "--train.device=cpu", "--run-dir", str(path / "run")], capsys)
    assert f"{path} is a file, not a directory" in line
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a directory")
    line = expect_one_line_error(["train", "--train.device=cpu"], capsys)
    assert "--run-dir runs" in line and "is a file" in line


@pytest.mark.parametrize("argv", [
    ["data", "tokenize", "TEXT", "--out", "PATH", "--workers", "1", "--val-fraction", "0"],
    ["tokenizer", "train", "TEXT", "--vocab-size", "260", "--out", "PATH"],
    ["train", *TINY_OVERRIDES, "--train.steps=1", "--data.train_files=SHARDS", "--run-dir", "PATH"],
])
def test_output_in_a_runs_checkpoints_folder_is_refused(argv, tmp_path, capsys, text_shards):
    """Shards, a tokenizer or a run written into RUN/checkpoints/step_N were deleted without a word when training
    kept its newest checkpoints (train.keep_checkpoints), or by `train --overwrite RUN`."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "config.toml").write_text("")
    (tmp_path / "doc.txt").write_text("def f(x):\n    return x\n" * 50)
    out = run / "checkpoints" / "step_000002" / "out"
    subs = {"PATH": str(out), "TEXT": str(tmp_path / "doc.txt"), "SHARDS": str(text_shards)}
    for key, value in subs.items():
        argv = [a.replace(key, value) for a in argv]
    line = expect_one_line_error(argv, capsys)
    assert f"lies in the checkpoints folder of run {run}" in line
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["data", "tokenize", "TEXT", "--out", "", "--workers", "1", "--val-fraction", "0"],
    ["data", "local-python", "--out", " ", "--max-tokens", "1000", "--workers", "1"],
    ["tokenizer", "train", "TEXT", "--vocab-size", "260", "--out", ""],
    ["export", "RUN", "--out", ""],
    ["export", "RUN", "--out", "", "--format", "hf"],
    ["report", "RUN", "--out", ""],  # report.png and report.html went into the current directory
])
def test_an_empty_out_is_refused_not_taken_for_the_current_directory(argv, tmp_path, monkeypatch, capsys):
    """`--out "$OUT"` with $OUT unset: Path("") is ".", so `data tokenize` wrote its shards and manifest.json into the
    current directory (replacing shards there), and `export` its files, exit 0."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    (tmp_path / "doc.txt").write_text("def f(x):\n    return x\n" * 50)
    subs = {"TEXT": str(tmp_path / "doc.txt"), "RUN": str(tmp_path / "run")}
    line = expect_one_line_error([subs.get(a, a) for a in argv], capsys)
    assert "--out is empty; pass a directory (. for this one)" in line
    assert not any(here.iterdir())


def test_the_checkpoints_folder_check_knows_runs_from_a_users_own_folders(tmp_path, capsys):
    """(A review of the check above) a project folder with the user's own config.toml and a `checkpoints/` folder of
    their outputs is no run: refused there, as a run's. A folder in a run's checkpoints that exists already was let
    through to `export --out`; a checkpoint given to --resume is told the run's directory."""
    project = tmp_path / "project"
    (project / "checkpoints").mkdir(parents=True)
    (project / "config.toml").write_text('preset = "tiny-cpu"\n')
    (tmp_path / "doc.txt").write_text("def f(x):\n    return x\n" * 50)
    out = project / "checkpoints" / "shards"
    assert main(["data", "tokenize", str(tmp_path / "doc.txt"), "--out", str(out), "--workers", "1",
                 "--val-fraction", "0"]) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "config.toml").write_text("")
    (run / "checkpoints" / "mine").mkdir()  # exists already
    from speedgpt.rundir.export_dir import ExportError, check_export_dir

    with pytest.raises(ExportError, match=f"lies in the checkpoints folder of run {run}"):  # (what export's --out meets)
        check_export_dir(run / "checkpoints" / "mine")
    line = expect_one_line_error(["train", "--resume", str(run / "checkpoints" / "step_000002")], capsys)
    assert line.endswith(f"--resume takes the run directory: --resume {run}")


def test_ctrl_c_is_one_line_and_130(tmp_path, monkeypatch, capsys, text_shards):
    import speedgpt.train.loop as loop

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", interrupted)
    argv = ["train", *TINY_OVERRIDES, f"--data.train_files={text_shards}", "--run-dir", str(tmp_path / "r")]
    try:
        rc = main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped speedgpt.cli.main: the user sees a traceback")
    assert rc == 130
    out, err = capsys.readouterr()
    assert err.strip() == "speedgpt train: interrupted" and "Traceback" not in out + err
    monkeypatch.setenv("SPEEDGPT_DEBUG", "1")  # the traceback is still there for whoever asks
    with pytest.raises(KeyboardInterrupt):
        main(argv)


def test_unexpected_errors_are_one_line_unless_debugging(monkeypatch, capsys):
    def broken(argv):
        raise KeyError("boom\nsecond line")

    monkeypatch.setitem(cli.COMMANDS, "report", (broken, ""))
    assert main(["report", "x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KeyError" in err and "SPEEDGPT_DEBUG=1" in err
    monkeypatch.setenv("SPEEDGPT_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["report", "x"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_names_the_fix(tmp_path, capsys, text_shards):
    line = expect_one_line_error(["train", "--train.device=cuda", f"--data.train_files={text_shards}",
                                  "--run-dir", str(tmp_path / "r")], capsys)
    assert "no usable CUDA device" in line and "--train.device=auto or cpu" in line
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.parametrize("args, named", [
    (["--temperature", "-1"], "--temperature"), (["--temperature", "nan"], "--temperature"),
    (["--top-k", "-1"], "--top-k"), (["--max-tokens", "0"], "--max-tokens"), (["--max-tokens", "-3"], "--max-tokens"),
])
def test_sample_refuses_nonsense(args, named, tmp_path, capsys):
    from evalkit import make_run

    run = make_run(tmp_path, steps=(1,))
    with pytest.raises(SystemExit) as e:
        main(["sample", str(run), "--prompt", "x", "--device", "cpu", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and named in err.splitlines()[-1]


def train_argv(text_shards, run_dir, *extra):
    return ["train", *TINY_OVERRIDES, "--train.steps=2", "--train.val_every=0", f"--data.train_files={text_shards}",
            "--run-dir", str(run_dir), *extra]


def test_run_dir_of_an_existing_run_is_refused_or_overwritten(tmp_path, capsys, text_shards):
    run = tmp_path / "run"
    assert main(train_argv(text_shards, run)) == 0
    first_metrics = (run / "metrics.jsonl").read_text()
    stamp = (run / "config.toml").stat().st_mtime_ns
    capsys.readouterr()
    line = expect_one_line_error(train_argv(text_shards, run, "--model.depth=3"), capsys)
    assert f"--resume {run}" in line and "fresh --run-dir" in line and "--overwrite" in line
    assert (run / "config.toml").stat().st_mtime_ns == stamp  # nothing touched
    (run / "report.html").write_text("old report")  # a file of the old run that the new one does not write
    assert main(train_argv(text_shards, run, "--model.depth=3", "--overwrite")) == 0
    assert "depth = 3" in (run / "config.toml").read_text()
    new_metrics = (run / "metrics.jsonl").read_text()
    assert new_metrics.count('"event"') == first_metrics.count('"event"')  # one run's records, not two
    assert not (run / "report.html").exists()  # the old run's files are gone, not mixed in
    # --run.dir=... is the same directory by another name
    line = expect_one_line_error(["train", *TINY_OVERRIDES, f"--data.train_files={text_shards}",
                                  f"--run.dir={run}"], capsys)
    assert "--resume" in line


def test_fp8_switches_on_cpu_name_the_dtype_that_runs(tmp_path, capsys, text_shards):
    argv = train_argv(text_shards, tmp_path / "r", "--model.fp8_head=true", "--model.fp8_mlp=true",
                      "--model.fp8_attn=true", "--model.fused_ce=true")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fp8 head: not supported on cpu" in out and "bf16" not in out
    for what in ("fp8 head", "fp8 mlp", "fp8 attn", "fused ce"):
        line = next(line for line in out.splitlines() if line.startswith(what))
        assert "float32" in line, line


def test_the_saved_config_names_the_directory_the_run_uses(tmp_path, capsys, text_shards, monkeypatch):
    """A new-user audit: --run-dir A saved run.dir = '' and --run-dir A --run.dir=B ran in A and saved B. The saved
    run.dir is the run's directory now; --run-dir beats a config file's run.dir, and --run-dir or --resume beside a
    --run.dir= naming another directory is refused (which one was meant?)."""
    from speedgpt.config import load_toml

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(train_argv(text_shards, a)) == 0
    assert load_toml(a / "config.toml").run.dir == str(a)
    line = expect_one_line_error(train_argv(text_shards, b, f"--run.dir={c}"), capsys)
    assert line == f"speedgpt train: --run-dir {b} and --run.dir={c} name two directories; give one of them"
    assert not b.exists() and not c.exists()
    line = expect_one_line_error(["train", "--resume", str(a), f"--run.dir={c}"], capsys)
    assert line == f"speedgpt train: --resume {a} continues {a} in place: drop --run.dir={c}"
    # Reproducing a run: its config names its directory, which holds it; the file is the run's record, so the new
    # run goes to a new directory, or to a --run-dir
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    before = (a / "config.toml").read_bytes()
    assert main(["train", "--config", str(a / "config.toml"), "--run.sample_tokens=0", "--run.report=false"]) == 0
    assert f"records the run in {a}; this run starts in a new directory" in capsys.readouterr().err
    [new_run] = (here / "runs").iterdir()
    assert load_toml(new_run / "config.toml").run.dir == f"runs/{new_run.name}"
    assert (a / "config.toml").read_bytes() == before
    # A copy of it names run a too: --overwrite from a file that only names a run replaced that run (a review)
    copy = tmp_path / "mine.toml"
    copy.write_bytes(before)
    line = expect_one_line_error(["train", "--config", str(copy), "--overwrite"], capsys)
    assert line == f"speedgpt train: --overwrite with --config {copy} would replace the run in {a}, which the " \
        f"file's run.dir names; give --run-dir {a} to replace it, or drop --overwrite to start a new directory"
    assert (a / "config.toml").read_bytes() == before and len(list((here / "runs").iterdir())) == 1
    assert main(["train", "--config", str(a / "config.toml"), "--run-dir", str(b), f"--run.dir={b}/"]) == 0
    assert load_toml(b / "config.toml").run.dir == str(b)


def test_help_and_config_commands(capsys):
    assert main(["help"]) == 0
    assert "config" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["help", "data", "tokenize"])
    assert e.value.code == 0 and "--val-fraction" in capsys.readouterr().out
    assert main(["help", "nope"]) == 2
    capsys.readouterr()
    for argv in (["help", "help"], ["help", "--help"]):  # "unknown command '--help'", exit 2
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert "help      this list" in out and err == ""
    assert main(["config", "--preset", "tiny-cpu", "--model.depth=3"]) == 0
    out = capsys.readouterr().out
    assert "model.depth = 3 (default 12)" in out and "transformer blocks" in out
    assert "train.device = " in out and "(no description)" not in out


@pytest.mark.parametrize("given, says", [
    ("RUN", "RUN is a run directory, not an override: give --config RUN/config.toml"),
    ("RUN/config.toml", "RUN/config.toml is a file, not an override: give a config file as --config RUN/config.toml"),
    ("tiny-cpu", "tiny-cpu is a preset, not an override: give --preset tiny-cpu"),
])
def test_config_given_a_run_dir_file_or_preset_without_its_flag_names_the_flag(given, says, tmp_path, capsys):
    # A new-user audit: `speedgpt config runs/x` said "override 'runs/x' must look like --section.key=value".
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('preset = "tiny-cpu"\n')
    line = expect_one_line_error(["config", given.replace("RUN", str(run))], capsys)
    assert says.replace("RUN", str(run)) in line, line
    line = expect_one_line_error(["config", "nonsense"], capsys)  # anything else: the override's shape
    assert "override 'nonsense' must look like --section.key=value" in line


def test_every_option_has_help():
    import argparse

    seen = []

    def check(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    check(sub)
            elif action.help is None and not isinstance(action, argparse._HelpAction):
                seen.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")

    real = argparse.ArgumentParser.parse_known_args

    def capture(self, args=None, namespace=None):
        check(self)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_known_args = capture
    try:
        for name in cli.COMMANDS:
            if name != "help":
                try:
                    cli.COMMANDS[name][0]([])
                except SystemExit:
                    pass
    finally:
        argparse.ArgumentParser.parse_known_args = real
    assert not seen, f"options without help text: {seen}"


@pytest.mark.parametrize("argv, named", [
    (["eval", "RUN", "--tokens", "0"], "--tokens"), (["eval", "RUN", "--limit", "0"], "--limit"),
    (["bench", "--steps", "0"], "--steps"),
])
def test_counts_below_one_are_refused(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path) if a == "RUN" else a for a in argv])
    assert e.value.code == 2 and named in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("argv, named", [
    (["--chat", "--hellaswag", "download"], "does not read --hellaswag"),
    (["--chat", "--core"], "does not read --core"),
    (["--chat", "--data", "X", "--tokens", "5"], "does not read --data --tokens"),
    (["--chat", "--split", "train"], "does not read --split"),
    (["--chat", "--core-bundle", "B", "--batch-rows", "2"], "does not read --core-bundle --batch-rows"),
    (["--chat", "--limit", "5"], "--limit N with --chat limits the --chat-choice / --chat-exact files"),
    (["--limit", "5"], "add --hellaswag"),
    (["--core", "--limit", "5"], "add --hellaswag"),
    (["--core-bundle", "DIR"], "--core-bundle: is for CORE; add --core"),
    (["--core-limit", "5"], "--core-limit: is for CORE; add --core"),
    (["--core-limit", "0", "--core"], "--core-limit 0: must be >= 1"),
    (["--chat-examples", "0"], "--chat-examples: scores a chat model; add --chat"),
    (["--chat-exact", "g.jsonl"], "--chat-exact: scores a chat model; add --chat"),
])
def test_eval_refuses_a_flag_its_mode_does_not_read(argv, named, tmp_path, capsys):
    # Each was silently ignored: a `--chat --hellaswag download` scored no HellaSwag, with exit 0.
    with pytest.raises(SystemExit) as e:
        main(["eval", str(tmp_path), *argv])
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and named in err[-1], err


def test_eval_takes_every_flag_combination_the_docs_show(monkeypatch):
    import re
    import shlex
    from pathlib import Path

    from speedgpt.chat import evaluate as chat_evaluate
    from speedgpt.commands.runs import EVAL_EPILOG
    from speedgpt.eval import run as eval_run

    root = Path(__file__).parent.parent
    texts = [EVAL_EPILOG] + [f.read_text() for f in [root / "README.md", *sorted((root / "docs").glob("*.md"))]]
    shown = {re.sub(r"[\[\]]", "", m).strip() for t in texts for m in re.findall(r"speedgpt eval ([^#`|\n]*)", t)}
    shown = {re.sub(r"\bN\b", "100", command) for command in shown}  # README's "[--tokens N]"
    assert len(shown) > 10 and any("--chat-exact" in c for c in shown) and any("--core-limit" in c for c in shown)
    called = []
    monkeypatch.setattr(eval_run, "evaluate_run", lambda *a, **kw: called.append(kw))
    monkeypatch.setattr(chat_evaluate, "evaluate_chat", lambda *a, **kw: called.append(kw))
    for command in sorted(shown):
        assert main(["eval", *shlex.split(command)]) == 0, command
    assert len(called) == len(shown)


@pytest.mark.parametrize("flags", [["--port", "9000"], ["--host", "0.0.0.0"], ["--host", "::1", "--port", "0"]])
def test_chat_refuses_host_and_port_without_serve(flags, tmp_path, capsys):
    # The terminal chat (and --prompt) listens on nothing: the port was silently ignored.
    with pytest.raises(SystemExit) as e:
        main(["chat", str(tmp_path), "--prompt", "hi", *flags])
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and "where --serve listens: add --serve" in err[-1], err


OUT_COMMANDS = {
    "sweep": ["sweep", "--out", "OUT", "--depths", "2", "--flops", "1e12", "--preset", "tiny-cpu"],
    "ab": ["ab", "--preset", "tiny-cpu", "--a", "", "--b", "--model.depth=3", "--seeds", "2", "--out", "OUT"],
    # a dry run lists the run directories it would make under --out: a file there is refused as in the real run
    "sweep --dry-run": ["sweep", "--out", "OUT", "--depths", "2", "--flops", "1e12", "--preset", "tiny-cpu", "--dry-run"],
    "ab --dry-run": ["ab", "--preset", "tiny-cpu", "--a", "", "--b", "--model.depth=3", "--seeds", "2", "--out", "OUT",
                     "--dry-run"],
}


@pytest.mark.parametrize("where", ["is-a-file", "under-a-file"])
@pytest.mark.parametrize("command", list(OUT_COMMANDS))
def test_sweep_and_ab_out_dir_errors_name_the_fix(command, where, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "file.bin"
    blocker.write_bytes(b"not a directory")
    out = blocker if where == "is-a-file" else blocker / "sub"
    line = expect_one_line_error([str(out) if a == "OUT" else a for a in OUT_COMMANDS[command]], capsys)
    assert "Errno" not in line and "pass a directory" in line, line
    assert (f"{out} is a file" if where == "is-a-file" else f"{blocker} is a file, not a directory") in line


def test_os_error_lines_name_the_fix(tmp_path):
    import errno

    from speedgpt.outdir import os_error_line

    out = tmp_path / "sweep"
    full = os_error_line(OSError(errno.ENOSPC, "No space left on device", str(out / "x")), "--out", out)
    assert full == f"--out {out}: no space left on its device; free some, or pass a directory on another disk"
    denied = os_error_line(PermissionError(errno.EACCES, "Permission denied", str(out / "a")), "--out", out)
    assert "no permission to write" in denied and "pass a directory you can write to" in denied


def test_option_values_that_look_like_options_are_bound():
    from speedgpt.argv import bind_values

    argv = ["--ab", "--model.fp8_head=false", "--steps", "3", "--train.x=1"]
    assert bind_values(argv, ("--ab",)) == ["--ab=--model.fp8_head=false", "--steps", "3", "--train.x=1"]
    assert bind_values(["--ab"], ("--ab",)) == ["--ab"]  # no value: argparse reports it


def test_bench_takes_an_ab_value_that_starts_with_dashes(monkeypatch):
    import speedgpt.bench as bench

    seen = []
    monkeypatch.setattr(bench, "bench_config", lambda cfg, *a, **k: seen.append(cfg) or {"tok_per_s": 1.0, "world_size": 1})
    assert bench.main(["--preset", "tiny-cpu", "--steps", "1", "--ab", "--model.depth=3"]) == 0
    assert [c.model.depth for c in seen][1] == 3


def test_bench_profile_trace_paths_reach_each_config_and_bad_folders_are_refused(monkeypatch, tmp_path, capsys):
    import speedgpt.bench as bench

    traces = []
    monkeypatch.setattr(bench, "bench_config", lambda cfg, *a, **k: traces.append(a[-1])
                        or {"tok_per_s": 1.0, "world_size": 1})
    monkeypatch.setattr(bench, "cuda_present", lambda: True)  # --profile measures CUDA kernels: the paths as on a GPU
    out = tmp_path / "tr"
    assert bench.main(["--preset", "tiny-cpu", "--steps", "1", "--profile", "3", "--profile-trace", str(out),
                       "--ab", "--model.depth=3"]) == 0
    assert traces == [out / "profile-A.json.gz", out / "profile-B.json.gz"] and out.is_dir()
    assert bench.rank_trace(traces[1], 3) == out / "profile-B-rank3.json.gz"
    assert bench.rank_trace(traces[1], 0) == traces[1]
    (out / "profile-B-rank3.json.gz").write_bytes(b"")  # another rank's trace of another bench: refused too
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny-cpu", "--steps", "1", "--profile", "3", "--profile-trace", str(out)])
    assert "profile-B-rank3.json.gz exists" in capsys.readouterr().err.splitlines()[-1]
    (out / "profile-A.json.gz").write_bytes(b"")  # another bench's trace: never overwritten
    (tmp_path / "file").write_text("x")
    for argv, says in ((["--profile-trace", str(out), "--profile", "3"], "exists; give a new folder"),
                       (["--profile-trace", str(tmp_path / "new")], "add --profile N"),
                       (["--profile-trace", str(tmp_path / "file"), "--profile", "3"], "a file, not a folder")):
        with pytest.raises(SystemExit) as e:
            bench.main(["--preset", "tiny-cpu", "--steps", "1", *argv])
        assert e.value.code == 2 and says in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("kind, says", [("missing", "does not exist"), ("empty-folder", "holds no run")])
def test_resume_of_something_that_is_no_run_says_so(tmp_path, capsys, kind, says):
    """--resume of a missing or empty folder names what is wrong with it, not its absent config.toml."""
    path = make_path(tmp_path, kind)
    line = expect_one_line_error(["train", "--resume", str(path)], capsys)
    assert f"--resume {path} {says}" in line and "--run-dir" in line


@pytest.mark.parametrize("cut", ["empty", "preset-line", "cut-before-train"])
def test_a_runs_config_emptied_or_cut_short_is_refused_not_read_as_defaults(cut, tmp_path, capsys):
    """(audit 29) A run's config.toml emptied or cut short (a full disk, a copy that stopped) was read as a short
    hand-written file: an empty one as the built-in defaults, one that kept its `preset` line as that preset.
    `export` wrote a 12-layer config.json beside the run's 2 layers' weights and exited 0; `train --resume` refused
    with a 512 GiB memory estimate or an --extend hint; `eval` and `sample` said the config was edited."""
    from evalkit import make_run

    run = make_run(tmp_path)
    text = (run / "config.toml").read_text()
    assert text.startswith('preset = "tiny-cpu"\n')
    (run / "config.toml").write_text({"empty": "", "preset-line": 'preset = "tiny-cpu"\n',
                                      "cut-before-train": text[:text.index("\n[train]")]}[cut])
    for argv in (["train", "--resume", str(run)], ["eval", str(run), "--device", "cpu"],
                 ["sample", str(run), "--prompt", "x", "--device", "cpu"], ["export", str(run)],
                 ["sft", str(run), "--run-dir", str(tmp_path / "sft")]):
        line = expect_one_line_error(argv, capsys)
        assert f"{run / 'config.toml'} is " in line and "restore it" in line, (argv, line)
    assert not (run / "export").exists() and not (tmp_path / "sft").exists()


def test_a_run_refused_for_its_data_leaves_no_run_behind(tmp_path, capsys):
    """The corrected command must not be refused as 'already holds a run' by the failed one's leftovers."""
    argv = ["train", "--train.device=cpu", f"--data.train_files={tmp_path / 'no-such-data'}",
            "--run-dir", str(tmp_path / "run")]
    for _ in range(2):
        line = expect_one_line_error(argv, capsys)
        assert "no files match" in line, line
    assert not (tmp_path / "run" / "config.toml").exists()


@pytest.mark.parametrize("inside_out, says", [(True, "no permission to write"), (False, "cannot read")])
def test_data_os_errors_are_one_line(tmp_path, capsys, monkeypatch, inside_out, says):
    """An OSError while building a corpus (no permission, a full disk) names the path and the fix; errors
    are injected, since root ignores file permissions."""
    import errno

    import speedgpt.data.tokenize as tok

    out = tmp_path / "out"
    where = out / "train_000000.bin" if inside_out else tmp_path / "input.txt"

    def refuse(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(where))

    monkeypatch.setattr(tok, "tokenize_files", refuse)
    line = expect_one_line_error(["data", "tokenize", str(tmp_path), "--out", str(out)], capsys)
    assert says in line and str(where) in line, line


@pytest.mark.parametrize("argv", [["config"], ["--help"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(argv):
    """`speedgpt config | head` exited 1 with "[Errno 32] Broken pipe"; the pipe here is closed before
    the command writes, so the write always meets it (no timing)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "speedgpt", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == ""


def test_bench_refuses_a_bad_config_or_data_with_status_2_as_train_does(tmp_path, capsys):
    """bench's config and data errors used to reach main()'s catch-all: one line, but exit 1."""
    (tmp_path / "empty").mkdir()
    for argv in (["bench", "--config", str(tmp_path / "missing.toml")],
                 ["bench", "--preset", "tiny-cpu", f"--data.train_files={tmp_path / 'empty'}", "--steps", "1"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("speedgpt bench: error: ") and err.count("\n") == 1, err


def test_auto_resume_keeps_a_finished_run_without_a_checkpoint(tmp_path, capsys, text_shards):
    """--auto-resume on a finished run that saved no checkpoint wiped it, without a word, and trained it again."""
    run = tmp_path / "nock"
    argv = train_argv(text_shards, run, "--train.save_final_checkpoint=false", "--train.checkpoint_every_min=0")
    assert main(argv) == 0
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*argv, "--auto-resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"speedgpt train: {run} holds a finished run without a checkpoint (nothing to resume); pick a "
                   f"fresh --run-dir, or pass --overwrite to replace it"], err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files


@pytest.mark.parametrize("extra", [["--run-dir", "OTHER"], ["--overwrite"]])
def test_resume_refuses_flags_it_ignored(extra, tmp_path, capsys):
    """`train --resume RUN --run-dir OTHER` wrote into RUN, and --overwrite continued the old run."""
    other = tmp_path / "other"
    with pytest.raises(SystemExit) as e:
        main(["train", "--resume", str(tmp_path / "run"), *[str(other) if a == "OTHER" else a for a in extra]])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and f"--resume continues {tmp_path / 'run'} in place: drop {extra[0]}" in err[-1], err
    assert not other.exists()


@pytest.mark.parametrize("command, names", [("data", "tokenize, local-python, fineweb"), ("tokenizer", "train, eval")])
def test_a_missing_subcommand_names_the_subcommands(command, names, capsys):
    """It said "the following arguments are required: what", an internal name."""
    with pytest.raises(SystemExit) as e:
        main([command])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"speedgpt {command}: error: choose one of: {names} (`speedgpt {command} --help` lists the options)"


@pytest.mark.parametrize("text, value", [("100000000", 10**8), ("1e8", 10**8), ("100M", 10**8), ("2.5B", 25 * 10**8),
                                         ("100_000", 10**5), ("10k", 10**4), ("0", 0), ("-3", -3)])
def test_count_reads_the_forms_help_texts_write(text, value):
    from speedgpt.argv import count

    assert count(text) == value


@pytest.mark.parametrize("text, says", [("1.5", "not a whole number"), ("abc", "not a whole number"),
                                        ("nan", "not a whole number"), ("inf", "not a whole number"),
                                        ("1e-9999", "not a whole number"), ("1e19", "too large"),
                                        ("1e999999999", "too large")])
def test_count_refuses_what_is_no_whole_number(text, says):
    import argparse

    from speedgpt.argv import count

    with pytest.raises(argparse.ArgumentTypeError, match=says):
        count(text)


@pytest.mark.parametrize("argv", [["train", "--bogus"], ["eval"], ["sample"], ["export"], ["data"],
                                  ["data", "tokenize"], ["tokenizer", "train"], ["ab", "--seeds", "x"],
                                  ["sweep", "--bogus"], ["bench", "--steps", "x"], ["sft"], ["chat", "--bogus"],
                                  ["config", "--preset"]])
def test_argument_errors_are_one_line_naming_help(argv, capsys):
    """argparse printed its whole usage block above the error (nine lines for `train`); every subcommand's parser
    (argv.Parser) now says it in one line that names the command's --help, exit 2."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "usage:" not in err, err
    assert err.startswith(f"speedgpt {argv[0]}") and "--help` lists the options" in err, err


@pytest.mark.parametrize("argv, says", [
    (["train", "--resume", ""], "--resume is empty; pass a directory, or drop --resume for its default"),
    (["train", "--run-dir", " "], "--run-dir is empty"),
    (["sft", "BASE", "--run-dir", ""], "--run-dir is empty"),
    (["sft", "--resume", ""], "--resume is empty"),
    (["ab", "--out", "", "--a", "", "--b", "--optim.muon_lr=0.03", "--seeds", "2", "--dry-run"], "--out is empty"),
    (["sweep", "--out", "", "--analyze"], "--out is empty; pass a directory ("),
])
def test_an_empty_run_path_is_refused_not_read_as_none_given(argv, says, tmp_path, monkeypatch, capsys):
    """`train --resume "$RUN"` with $RUN unset started a new run instead of resuming one; `--run-dir ""` trained into a
    default directory; `ab --out ""` a new runs/ab-<time> each time (a rerun trained every run again); `sweep --out ""`
    analyzed, or trained into, the current directory."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
    assert not any(here.iterdir())
