"""`speedgpt export`: safetensors + config.json that load back to the same model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from evalkit import make_run
from speedgpt.cli import main
from speedgpt.config import load_toml
from speedgpt.export import dedupe_shared, export_model
from speedgpt.infer.load import LoadError, load_model


pytestmark = pytest.mark.usefixtures("one_thread")


def logits_of(model, seed=0):
    x = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("extra", [[], ["--model.num_kv_heads=1"]], ids=["mha", "gqa"])
def test_fp32_round_trip_gives_identical_logits(tmp_path, extra):
    run = make_run(tmp_path, extra=extra)
    out = export_model(run, tmp_path / "exp", dtype="fp32")
    assert sorted(p.name for p in out.iterdir()) == [".speedgpt-export.json", "config.json", "model.safetensors"]
    a, cfg_a = load_model(run)
    b, cfg_b = load_model(out)
    assert cfg_a.to_dict() == cfg_b.to_dict() == load_toml(run / "config.toml").to_dict()
    assert b.windows == a.windows == (64, 16)
    ref = logits_of(a)
    assert torch.equal(ref, logits_of(b))
    assert ref.std() > 0.1  # random weights: the comparison means something


def test_config_json_is_the_full_config_plus_format_and_provenance(tmp_path):
    run = make_run(tmp_path, steps=(1, 2))
    out = export_model(run, tmp_path / "exp", checkpoint=1)
    meta = json.loads((out / "config.json").read_text())
    assert meta["format_version"] == 1
    full = load_toml(run / "config.toml").to_dict()
    assert {k: meta[k] for k in full} == full
    assert meta["export"]["step"] == 1 and meta["export"]["checkpoint"] == "step_000001"
    assert meta["export"]["tokens"] == 256 and meta["export"]["dtype"] == "bf16"


def test_bf16_export_is_close_and_keeps_scalars_fp32(tmp_path):
    from safetensors import safe_open

    run = make_run(tmp_path)
    out = export_model(run, tmp_path / "exp")  # bf16 by default
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes["embed.weight"] == "BF16" and dtypes["blocks.0.attn.qkv_w"] == "BF16"
    assert dtypes["block_lambdas"] == "F32" and dtypes["skip_weights"] == "F32"
    a, _ = load_model(run)
    b, _ = load_model(out)
    ref, got = logits_of(a), logits_of(b)
    assert not torch.equal(ref, got)
    assert (ref - got).abs().max() < 0.1 * ref.abs().max()
    fp32 = export_model(run, tmp_path / "exp32", dtype="fp32")
    assert (out / "model.safetensors").stat().st_size < 0.6 * (fp32 / "model.safetensors").stat().st_size


def test_compiled_prefix_and_shared_tensors(tmp_path):
    from safetensors import safe_open

    run = make_run(tmp_path, prefix="_orig_mod.", tie=True)
    ref_model, _ = load_model(run)  # load strips the prefix and keeps the tie
    assert torch.equal(ref_model.lm_head.weight, ref_model.embed.weight)
    out = export_model(run, tmp_path / "exp", dtype="fp32")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not any(k.startswith("_orig_mod.") for k in keys)
    assert "embed.weight" in keys and "lm_head.weight" not in keys  # written once
    assert json.loads((out / "config.json").read_text())["export"]["aliases"] == {"lm_head.weight": "embed.weight"}
    model, _ = load_model(out)
    assert torch.equal(logits_of(model), logits_of(ref_model))


def test_dedupe_shared_copies_partial_overlaps():
    base = torch.arange(12.0)
    state = {"a": base.view(3, 4), "b": base.view(3, 4), "c": base[4:8], "d": torch.ones(2)}
    kept, aliases = dedupe_shared(state)
    assert aliases == {"b": "a"} and set(kept) == {"a", "c", "d"}
    assert kept["c"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert torch.equal(kept["c"], base[4:8])
    from safetensors.torch import save

    save(kept)  # safetensors accepts the result


def test_cli_export_replaces_old_exports_only(tmp_path, capsys):
    run = make_run(tmp_path)
    assert main(["export", str(run)]) == 0
    assert "exported" in capsys.readouterr().out
    assert (run / "export" / "model.safetensors").is_file()
    assert main(["export", str(run), "--dtype", "fp32"]) == 0  # over the old export: fine
    assert json.loads((run / "export" / "config.json").read_text())["export"]["dtype"] == "fp32"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(other)]) == 2
    assert f"--out {other} holds files that no speedgpt export wrote" in capsys.readouterr().err
    assert (other / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.rglob(".*") if p.is_dir()]  # no temp dirs left behind
    assert main(["export", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_export_format_checks(tmp_path):
    run = make_run(tmp_path)
    out = export_model(run, tmp_path / "exp", dtype="fp32")
    meta = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text("[]")  # valid JSON of another shape: it was an AttributeError
    with pytest.raises(LoadError, match="is a JSON list, not an export's object; re-export"):
        load_model(out)
    meta["format_version"] = 99
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(LoadError, match="format_version=99"):
        load_model(out)
    meta["format_version"] = 1
    meta["model"]["model_dim"] = 128
    meta["model"]["head_dim"] = 32
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(LoadError, match="do not fit the model"):
        load_model(out)
    (out / "model.safetensors").unlink()
    with pytest.raises(LoadError, match="has no model.safetensors"):
        load_model(out)


def test_export_refuses_a_folder_it_did_not_write(tmp_path, capsys):
    """A Hugging Face-style folder (its own config.json) was taken for an old export and wiped."""
    run = make_run(tmp_path)
    hf = tmp_path / "hf"
    hf.mkdir()
    files = {"config.json": '{"architectures": ["GPT2LMHeadModel"]}', "pytorch_model.bin": "weights",
             "notes.txt": "mine"}
    for name, text in files.items():
        (hf / name).write_text(text)
    assert main(["export", str(run), "--out", str(hf)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {hf}" in err and "empty or new --out" in err
    assert {p.name: p.read_text() for p in hf.iterdir()} == files
    assert not [p for p in tmp_path.rglob(".*") if p.is_dir()]


def test_reexport_replaces_only_the_files_it_wrote(tmp_path, capsys):
    run = make_run(tmp_path)
    out = tmp_path / "exp"
    assert main(["export", str(run), "--out", str(out)]) == 0
    (out / "README.md").write_text("my notes")
    assert main(["export", str(run), "--out", str(out), "--dtype", "fp32"]) == 0
    assert (out / "README.md").read_text() == "my notes"
    assert json.loads((out / "config.json").read_text())["export"]["dtype"] == "fp32"
    manifest = json.loads((out / ".speedgpt-export.json").read_text())
    assert manifest == {"format": "speedgpt", "files": ["config.json", "model.safetensors"], "complete": True,
                        "source": str(run.resolve())}
    size = (out / "model.safetensors").stat().st_size + (out / "config.json").stat().st_size
    assert f"({size / 2**20:.1f} MiB, fp32, speedgpt format)" in capsys.readouterr().out  # the export's files, not the README
    load_model(out)
    # An export written before manifests existed is still recognized as one (and gets a manifest).
    (out / ".speedgpt-export.json").unlink()
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert (out / "README.md").read_text() == "my notes"
    assert json.loads((out / ".speedgpt-export.json").read_text())["files"] == ["config.json", "model.safetensors"]


def test_export_files_never_overwrites_a_file_it_did_not_write(tmp_path):
    """The manifest mechanism every export format writes through (rundir/export_dir.py)."""
    from speedgpt.rundir.export_dir import ExportError, export_files

    out = tmp_path / "exp"
    with export_files(out, "test") as tmp:
        (tmp / "a.txt").write_text("a1")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b1")
    (out / "c.txt").write_text("user's")
    with pytest.raises(ExportError, match="holds c.txt, which no speedgpt export wrote"):
        with export_files(out, "test") as tmp:
            (tmp / "a.txt").write_text("a2")
            (tmp / "c.txt").write_text("ours?")
    assert (out / "a.txt").read_text() == "a1" and (out / "c.txt").read_text() == "user's"
    with export_files(out, "other") as tmp:  # files the new export does not write again are removed
        (tmp / "a.txt").write_text("a3")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        ".speedgpt-export.json", "a.txt", "c.txt"]
    assert (out / "a.txt").read_text() == "a3"
    assert not [p for p in tmp_path.rglob(".*") if p.is_dir()]


def test_an_interrupted_export_is_refused_by_readers_and_redone(tmp_path, monkeypatch, capsys):
    import os

    from speedgpt.rundir import export_dir

    run = make_run(tmp_path)
    out = tmp_path / "exp"
    export_model(run, out)
    calls, rename = [], os.replace

    def dies_after_one(src, dst):  # the process stops between two renames: the manifest's, a file's
        calls.append(dst)
        if len(calls) == 3:
            raise KeyboardInterrupt
        rename(src, dst)

    monkeypatch.setattr(export_dir.os, "replace", dies_after_one)
    with pytest.raises(KeyboardInterrupt):
        export_model(run, out, dtype="fp32")
    monkeypatch.undo()
    with pytest.raises(LoadError, match="is incomplete .* re-run `speedgpt export"):
        load_model(out)
    assert main(["export", str(run), "--out", str(out), "--dtype", "fp32"]) == 0
    load_model(out)
    assert not [p for p in tmp_path.rglob(".*") if p.is_dir()]


@pytest.mark.parametrize("fmt", ["speedgpt", "hf"])
@pytest.mark.parametrize("damage", ["text", "truncated"])
def test_a_damaged_safetensors_file_is_one_line_naming_it(tmp_path, capsys, fmt, damage):
    """safetensors' own "SafetensorError: Error while deserializing header" was exit 1, naming neither the file
    nor the fix; every reader (sample, eval, chat, export from an export) loads through rundir/weights.py."""
    run = make_run(tmp_path)
    exp = tmp_path / "exp"
    assert main(["export", str(run), "--out", str(exp), "--format", fmt, "--dtype", "fp32"]) == 0
    weights = exp / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"hello\n" if damage == "text" else data[:len(data) // 2])
    hf = " --format hf" if fmt == "hf" else ""
    for err in _readers_refuse_in_one_line(exp, tmp_path, capsys):
        assert f"{weights} is unreadable" in err and f"re-run `speedgpt export RUN_DIR{hf} --out {exp}`" in err
    with pytest.raises(LoadError, match="is unreadable"):
        load_model(exp)


def test_a_flipped_byte_in_an_exports_tensors_is_caught(tmp_path, capsys):
    """The header intact, one tensor byte flipped: the export loaded, sampled and exported again without a word
    (a run's checkpoints are checksummed; an export was not). Its config.json now records the weights' SHA-256."""
    run = make_run(tmp_path)
    exp = tmp_path / "exp"
    assert main(["export", str(run), "--out", str(exp), "--dtype", "fp32"]) == 0
    weights = exp / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # the last tensor's data: safetensors reads it as a number like any other
    weights.write_bytes(bytes(data))
    for err in _readers_refuse_in_one_line(exp, tmp_path, capsys):
        assert f"{weights} is corrupt: its SHA-256 differs" in err and f"re-run `speedgpt export {run} --out {exp}`" in err
    assert not (tmp_path / "again").exists()


def _readers_refuse_in_one_line(exp, tmp_path, capsys) -> list[str]:
    """`sample` and `export` of a damaged export: exit 2, nothing on stdout, one line each on stderr (returned)."""
    capsys.readouterr()
    errs = []
    for argv in (["sample", str(exp), "--prompt", "hi", "--max-tokens", "2"],
                 ["export", str(exp), "--out", str(tmp_path / "again")]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, err
        errs.append(err)
    return errs


@pytest.mark.parametrize("fmt", ["speedgpt", "hf"])
def test_export_refuses_to_replace_the_export_of_another_run(tmp_path, capsys, fmt, monkeypatch):
    """It replaced it with exit 0 and no word. The same run's export (named another way) is replaced as before."""
    first, second = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    out = tmp_path / "exp"
    assert main(["export", str(first), "--out", str(out), "--format", fmt]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["export", str(second), "--out", str(out), "--format", fmt]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--out {out} holds the export of {first.resolve()}, not of {second}; choose another --out" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.chdir(tmp_path)  # the same run by a relative path: a re-export
    typed = str(first.relative_to(tmp_path))
    assert main(["export", typed, "--out", str(out), "--format", fmt, "--dtype", "fp32"]) == 0
    # An export from before the manifest recorded its source: its config.json's `source` is compared.
    manifest = json.loads((out / ".speedgpt-export.json").read_text())
    del manifest["source"]
    (out / ".speedgpt-export.json").write_text(json.dumps(manifest))
    assert main(["export", str(second), "--out", str(out), "--format", fmt]) == 2
    assert f"holds the export of {typed}, not of {second}" in capsys.readouterr().err  # as recorded
    # ... and names the same run from any directory (resolved against today's, it refused the re-export: a review)
    monkeypatch.chdir(tmp_path.parent)
    assert main(["export", str(first), "--out", str(out), "--format", fmt]) == 0
    # A run copied elsewhere re-exports into a folder of its own even where the export it carries names the original
    copied = tmp_path / "copied"
    shutil.copytree(first, copied)
    assert main(["export", str(copied), "--out", str(copied / "exp"), "--format", fmt]) == 0


def test_export_under_a_file_names_the_file(tmp_path, capsys):
    """It was "[Errno 17] File exists" with exit 1."""
    run = make_run(tmp_path)
    (tmp_path / "text.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(tmp_path / "text.txt" / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"speedgpt export: --out {tmp_path / 'text.txt' / 'sub'} cannot be made: {tmp_path / 'text.txt'} "
                   f"is a file, not a directory; pass a directory (new or existing)")
    assert (tmp_path / "text.txt").read_text() == "mine"


def test_export_refuses_weights_its_config_does_not_fit(tmp_path, capsys):
    """(audit 29) A run whose config.toml was edited after training (model.depth 4 -> 5) exported with exit 0: a
    config.json of 5 layers beside 4 layers' weights, which every later load refused (`--format hf` refused at once)."""
    run = make_run(tmp_path)
    config = run / "config.toml"
    assert "\ndepth = 4\n" in config.read_text()
    config.write_text(config.read_text().replace("\ndepth = 4\n", "\ndepth = 5\n"))
    assert main(["export", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not fit the model its config describes (missing blocks.4." in err[0], err
    assert not (run / "export").exists()
