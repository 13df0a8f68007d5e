"""`speedgpt data tokenize` as a user meets it: kinds chosen per file, skipped files named, a val
split made, a build that reads nothing is an error, and a short summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from speedgpt.cli import main
from speedgpt.data.shards import find_shards
from speedgpt.data.tokenize import tokenize_files

REPO = Path(__file__).resolve().parent.parent


def test_directory_files_are_read_by_their_own_kind(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.txt").write_text("plain text file")
    (d / "b.jsonl").write_text(json.dumps({"text": "from jsonl"}) + "\n")
    pq.write_table(pa.table({"text": ["from parquet 1", "from parquet 2"]}), d / "c.parquet")
    (d / "d.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    m = tokenize_files([d], tmp_path / "out", val_fraction=0.0, workers=1, progress=False)
    assert [s["kind"] for s in m["sources"]] == ["text", "jsonl", "parquet"]
    assert [s["documents"] for s in m["sources"]] == [1, 1, 2]
    assert m["sources"][0]["skipped"] == {"binary (NUL bytes)": {"count": 1, "examples": [str(d / "d.png")]}}


def test_a_parquet_directory_is_read_as_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    d = tmp_path / "nanochat"  # nanochat's layout: a directory of shard_NNNNN.parquet
    d.mkdir()
    for i in range(2):
        pq.write_table(pa.table({"text": [f"doc {i}-{j} " * 20 for j in range(5)]}), d / f"shard_{i:05d}.parquet")
    m = tokenize_files([d], tmp_path / "out", workers=1, progress=False)
    assert [s["kind"] for s in m["sources"]] == ["parquet"] and m["documents"] == 10
    assert m["train"]["documents"] == 9 and m["val"]["documents"] == 1


def test_nothing_read_is_an_error_naming_why(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.bin").write_bytes(b"\x00" * 100)
    (tmp_path / "in" / "y.txt").write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(ValueError, match="every item was skipped"):
        tokenize_files([tmp_path / "in"], tmp_path / "out", workers=1, progress=False)
    rc = main(["data", "tokenize", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--workers", "1"])
    err = capsys.readouterr().err
    assert rc != 0 and "binary (NUL bytes): 1" in err and "not UTF-8: 1" in err
    assert not list((tmp_path / "out").glob("*.bin")) and not (tmp_path / "out" / "manifest.json").exists()


def test_one_document_cannot_be_split(tmp_path):
    (tmp_path / "one.txt").write_text("a single document")
    with pytest.raises(ValueError, match="val split needs at least 2"):
        tokenize_files([tmp_path / "one.txt"], tmp_path / "out", workers=1, progress=False)
    m = tokenize_files([tmp_path / "one.txt"], tmp_path / "out", val_fraction=0.0, workers=1, progress=False)
    assert m["train"]["documents"] == 1 and m["val"]["documents"] == 0


def test_small_inputs_get_a_val_split_in_input_order(tmp_path):
    texts = [f"document number {i} " * (i + 1) for i in range(6)]
    for i, t in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(t)
    m = tokenize_files([tmp_path], tmp_path / "out", workers=1, progress=False)
    assert m["val"]["documents"] == 1 and m["train"]["documents"] == 5
    assert len(find_shards(tmp_path / "out", "val")) == 1
    m2 = tokenize_files([tmp_path / f"{i}.txt" for i in range(6)], tmp_path / "out2", workers=2, progress=False)
    assert (tmp_path / "out" / "val_000000.bin").read_bytes() == (tmp_path / "out2" / "val_000000.bin").read_bytes()
    assert (tmp_path / "out" / "train_000000.bin").read_bytes() == (tmp_path / "out2" / "train_000000.bin").read_bytes()
    assert m2["val"]["documents"] == 1


def test_local_python_small_build_gets_a_val_document_or_names_max_tokens(tmp_path, capsys, monkeypatch):
    """A new-user audit: `data local-python --max-tokens 2000` wrote 3 train documents and an empty val split (no
    file's hash falls below 1 %). Now the smallest hash is val, as `data tokenize` does; train holds none of it."""
    from speedgpt.data import corpus
    from speedgpt.data.shards import load_shard
    from speedgpt.data.tokenizer import BOS_ID

    root = tmp_path / "lib"
    root.mkdir()
    for i in range(6):
        (root / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}  # module number {i}\n" * (10 + i))
    monkeypatch.setattr(corpus, "python_source_roots", lambda: [("stdlib", root)])
    out = tmp_path / "out"
    assert main(["data", "local-python", "--max-tokens", "400", "--out", str(out), "--workers", "1"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["stopped_early"] and m["train"]["documents"] >= 1 and m["val"]["documents"] == 1
    assert "; val 1 doc /" in capsys.readouterr().out

    def documents(split):
        tokens = load_shard(out / f"{split}_000000.bin").numpy().tolist()
        starts = [i for i, t in enumerate(tokens) if t == BOS_ID]
        return {tuple(tokens[a:b]) for a, b in zip(starts, [*starts[1:], len(tokens)])}

    assert documents("val") and not documents("val") & documents("train")
    # One document before max_tokens stops the build: no val split can be made, and the fix is named.
    rc = main(["data", "local-python", "--max-tokens", "10", "--out", str(tmp_path / "one"), "--workers", "1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("speedgpt data")]
    assert rc == 2 and len(err) == 1 and "only 1 distinct document read before max_tokens=10" in err[0], err
    assert err[0].endswith("raise --max-tokens (for train's default corpus: data.local_max_tokens)")
    assert not list((tmp_path / "one").glob("*.bin")) and not (tmp_path / "one" / "manifest.json").exists()


@pytest.mark.parametrize("how", ["bad input", "build raises"])
def test_a_failed_local_python_build_leaves_no_lock_and_a_rerun_builds(tmp_path, capsys, monkeypatch, how):
    """A failed `data local-python` left its --out holding `.lock` (ensure_local_python_corpus's build lock): the
    folder it made was not removed, and looked used or half-built. Failed: no lock file, and no folder it made."""
    from speedgpt.data import corpus
    from speedgpt.data import tokenize as tok

    root = tmp_path / "lib"
    root.mkdir()
    for i in range(6):
        (root / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}  # module number {i}\n" * (10 + i))
    monkeypatch.setattr(corpus, "python_source_roots", lambda: [("stdlib", root)])
    build = tok.tokenize_corpus

    def fails(*args, **kwargs):  # a disk error mid-build, its own lock taken as the real build takes it
        with tok.building_into(Path(args[1])):
            raise OSError(5, "Input/output error")

    def local_python(out, max_tokens):
        return main(["data", "local-python", "--max-tokens", str(max_tokens), "--out", str(out), "--workers", "1"])

    # bad input: one document before max_tokens stops the build, so no val split (a TokenizeError)
    max_tokens = 10 if how == "bad input" else 400
    if how == "build raises":
        monkeypatch.setattr(tok, "tokenize_corpus", fails)
    out = tmp_path / "new" / "shards"
    assert local_python(out, max_tokens) == 2
    assert not (tmp_path / "new").exists(), list((tmp_path / "new").rglob("*"))  # the folders it made are gone
    mine = tmp_path / "mine"
    mine.mkdir()  # a folder that was there before the command is kept, as empty as it was
    assert local_python(mine, max_tokens) == 2
    assert list(mine.iterdir()) == []
    # The same --out again, with a build that works: built
    monkeypatch.setattr(tok, "tokenize_corpus", build)
    capsys.readouterr()
    assert local_python(out, 400) == 0, capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["val"]["documents"] == 1


def test_readme_example_then_train(tmp_path, capsys, monkeypatch):
    # The README's own example, then training on what it wrote.
    monkeypatch.chdir(REPO)
    out = tmp_path / "mine"
    assert main(["data", "tokenize", "docs/", "README.md", "--out", str(out), "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    assert "{" not in printed and len(printed) < 600  # a summary, not the manifest
    assert "documents" in printed and "train" in printed and "val 1 doc /" in printed
    rc = main(["train", *TINY_OVERRIDES, "--train.steps=2", f"--data.train_files={out}",
               "--run-dir", str(tmp_path / "run")])
    assert rc == 0, capsys.readouterr().err


def test_summary_names_skipped_files(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"{i}.txt").write_text(f"text {i}")
    (tmp_path / "in" / "logo.png").write_bytes(b"\x89PNG\x00\x00")
    assert main(["data", "tokenize", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "tokenized 3 documents" in out and "skipped 1 item: binary (NUL bytes)" in out and "logo.png" in out


def test_jsonl_without_the_text_field_hints_text_field_and_leaves_no_empty_out(tmp_path, capsys):
    """Was a good error without the --text-field hint, and an empty --out folder left behind."""
    data = tmp_path / "notes.jsonl"
    data.write_text(json.dumps({"content": "hello there", "id": 1}) + "\n" + json.dumps({"content": "again"}) + "\n")
    out = tmp_path / "new" / "shards"
    assert main(["data", "tokenize", str(data), "--out", str(out), "--workers", "1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("tokenizing (")]
    assert len(err) == 1, err
    assert "no string field 'text': 2 (e.g. " in err[0] and ":1 with fields: content, id)" in err[0]
    assert err[0].endswith("name the field that holds the text with --text-field")
    assert not (tmp_path / "new").exists()  # the folders this command made are gone again
    mine = tmp_path / "mine"
    mine.mkdir()  # a folder that was there before the command is not its to remove
    assert main(["data", "tokenize", str(data), "--out", str(mine), "--workers", "1"]) == 2
    assert mine.is_dir()
    assert main(["data", "tokenize", str(data), "--out", str(out), "--workers", "1", "--text-field", "content"]) == 0


def test_help_says_a_long_document_gets_a_shard_of_its_own(capsys):
    """--shard-tokens is a cap on shards of many documents; test_data_tokenize checks the long one's shard."""
    with pytest.raises(SystemExit) as e:
        main(["data", "tokenize", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "one longer than that gets a shard of its own" in help_text


@pytest.mark.parametrize("argv, says", [
    (["tokenize", "X", "--max-tokens", "0"], "--max-tokens 0: must be >= 1"),  # was 'only 1 distinct document read'
    (["tokenize", "X", "--workers", "0"], "--workers 0: must be >= 1"),  # was accepted
    (["local-python", "--workers", "-3"], "--workers -3: must be >= 1"),
    (["local-python", "--max-tokens", "-5"], "--max-tokens -5: must be >= 0"),
    (["fineweb", "--shards", "0"], "--shards 0: must be 1..103"),  # passed, fetched the val shard alone
    (["fineweb", "--shards", "104"], "--shards 104: must be 1..103"),
])
def test_bad_counts_are_refused_by_name(tmp_path, capsys, argv, says):
    from speedgpt.cli import main

    (tmp_path / "a.txt").write_text("hello world\n")
    argv = [str(tmp_path / "a.txt") if a == "X" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        main(["data", *argv, "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_second_build_into_a_folder_being_built_is_refused_and_leaves_the_first_alone(tmp_path, capsys):
    """Two `data tokenize` runs into one --out: the second must fail at once with one line, not delete the first's
    half-written shards as it starts (it began by clearing the build folder); once the first is done, it builds."""
    from speedgpt.data.tokenize import BUILD_SUBDIR, building_into

    (tmp_path / "in").mkdir()
    for i in range(4):
        (tmp_path / "in" / f"{i}.txt").write_text(f"document {i} " * 50)
    out = tmp_path / "out"
    out.mkdir()
    argv = ["data", "tokenize", str(tmp_path / "in"), "--out", str(out), "--workers", "1"]
    with building_into(out):  # the first build, mid-way: its shards so far in the build folder
        (out / BUILD_SUBDIR).mkdir()
        (out / BUILD_SUBDIR / "train_000000.bin").write_bytes(b"first build's shard")
        rc = main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert f"another `speedgpt data` build is writing into {out}" in err and "another --out" in err
        assert (out / BUILD_SUBDIR / "train_000000.bin").read_bytes() == b"first build's shard"
        assert not (out / "manifest.json").exists()
    assert main(argv) == 0
    assert json.loads((out / "manifest.json").read_text())["documents"] == 4


def test_an_out_that_holds_a_training_run_is_refused(tmp_path, capsys):
    """`data tokenize TXT --out RUN_DIR` exited 0 and dropped train_*.bin, val_*.bin and manifest.json into the run."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one document\n\ntwo documents\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("preset = 'tiny-cpu'\n")
    assert main(["data", "tokenize", str(tmp_path / "in"), "--out", str(run), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {run} holds a training run" in err, err
    assert sorted(p.name for p in run.iterdir()) == ["config.toml"]


@pytest.mark.parametrize("holds, says", [
    ("export", "holds a model export (`speedgpt export`)"),
    ("old-export", "holds a model export (`speedgpt export`)"),
    ("tokenizer", "holds a tokenizer (`speedgpt tokenizer train`)"),
])
def test_an_out_that_holds_an_export_or_a_tokenizer_is_refused(tmp_path, capsys, holds, says):
    """Only a run folder was refused: an export or a tokenizer folder took the shards and manifest.json among its
    files (and a later export there removed them, or `tokenizer train --overwrite` mixed with them)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one document\n\ntwo documents\n")
    out = tmp_path / "out"
    out.mkdir()
    if holds == "export":
        (out / ".speedgpt-export.json").write_text(json.dumps({"format": "speedgpt", "files": ["config.json"],
                                                                "complete": True}))
        (out / "config.json").write_text("{}")
    elif holds == "old-export":  # made before exports kept a manifest
        (out / "config.json").write_text(json.dumps({"format_version": 1, "export": {"source": "runs/x"}}))
    else:
        (out / "speedgpt_tokenizer.json").write_text("{}")
    before = sorted(p.name for p in out.iterdir())
    assert main(["data", "tokenize", str(tmp_path / "in"), "--out", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"speedgpt data: --out {out} {says}; pass another directory for the shards"
    assert sorted(p.name for p in out.iterdir()) == before


def test_counts_take_the_forms_the_help_shows(tmp_path, capsys):
    """--shard-tokens 100M and --max-tokens 1e4 were refused ("invalid int value") though the help says
    "default 100M"."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one document\n")
    (tmp_path / "in" / "b.txt").write_text("two documents\n")
    out = tmp_path / "out"
    assert main(["data", "tokenize", str(tmp_path / "in"), "--out", str(out), "--workers", "1",
                 "--shard-tokens", "100M", "--max-tokens", "1e4"]) == 0
    assert json.loads((out / "manifest.json").read_text())["documents"] == 2
    with pytest.raises(SystemExit) as e:
        main(["data", "tokenize", str(tmp_path / "in"), "--out", str(tmp_path / "o2"), "--shard-tokens", "1.5K7"])
    assert e.value.code == 2
    assert "argument --shard-tokens: '1.5K7' is not a whole number (e.g. 100000000, 1e8, 100M, 2.5B)" in \
        capsys.readouterr().err
