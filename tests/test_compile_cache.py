"""train.compile_cache (speedgpt/train/compile_cache.py): torch's portable cache artifacts written after the
warmup, read back into a fresh cache folder, and a foreign, unreadable or missing file ignored with one line.
No compile here: an artifact recorded through torch's own recorder stands in for a compiled graph's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch.compiler._cache import CacheArtifactManager

from speedgpt.config import Config, apply_overrides
from speedgpt.train.compile_cache import CompileCache, config_digest, default_root, folder_name, versions

KEY = "speedgpt-test/kernel.best_config"  # an autotune entry: a JSON file under Inductor's cache dir


@pytest.fixture
def fresh_artifacts():
    """torch's artifact recorder emptied for the test, as a fresh process has it (its kinds registered, as
    Inductor's import registers them)."""
    import torch._inductor.runtime.autotune_cache  # noqa: F401

    with CacheArtifactManager.with_fresh_cache():
        yield


def cache_in(tmp_path: Path) -> CompileCache:
    return CompileCache.for_run(str(tmp_path / "cache"), Config().to_dict(), 1, torch.device("cpu"))


def test_artifacts_saved_then_loaded_into_a_fresh_machines_cache(tmp_path, monkeypatch, fresh_artifacts):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first"))
    cache = cache_in(tmp_path)
    assert cache.save() is None  # nothing compiled: nothing written
    assert not cache.artifacts.exists()
    CacheArtifactManager.record_artifact("autotune", KEY, {"XBLOCK": 64, "num_warps": 4})
    line = cache.save()
    assert "saved 1 artifact(s)" in line and cache.artifacts.exists()
    meta = json.loads(cache.meta.read_text())
    assert meta["versions"] == versions(torch.device("cpu")) and meta["versions"]["torch"] == torch.__version__
    # another machine: an empty Inductor cache, filled from the saved file
    fresh = tmp_path / "second"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fresh))
    assert "loaded 1 artifact(s)" in cache.load()
    assert json.loads((fresh / KEY).read_text())["XBLOCK"] == 64


def test_foreign_corrupt_or_missing_files_are_ignored_with_one_line(tmp_path, monkeypatch, fresh_artifacts):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "first"))
    cache = cache_in(tmp_path)
    assert "nothing saved for this config yet" in cache.load()
    CacheArtifactManager.record_artifact("autotune", KEY, {"XBLOCK": 64})
    cache.save()
    fresh = tmp_path / "second"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fresh))
    meta = json.loads(cache.meta.read_text())
    cache.meta.write_text(json.dumps({**meta, "versions": {**meta["versions"], "device": "NVIDIA H100 sm90"}}))
    line = cache.load()
    assert "ignoring" in line and "NVIDIA H100 sm90" in line and "\n" not in line
    assert not (fresh / KEY).exists()  # nothing of the foreign file was used
    cache.meta.write_text(json.dumps(meta))
    cache.artifacts.write_bytes(b"not an artifact file")
    line = cache.load()
    assert "ignoring" in line and "\n" not in line and not (fresh / KEY).exists()
    cache.meta.write_text("{")
    assert "missing or unreadable" in cache.load()


def test_cache_folder_and_config_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_root() == tmp_path / "xdg" / "speedgpt" / "compile"
    cpu = torch.device("cpu")
    default = CompileCache.for_run("", Config().to_dict(), 1, cpu)
    assert default.folder.parent == default_root() and torch.__version__.split("+")[0] in default.folder.name
    assert CompileCache.for_run("off", Config().to_dict(), 1, cpu) is None
    assert "/" not in folder_name({"torch": "2.13.0+cu130", "triton": "3.6", "python": "3.11", "device": "A/B C"})
    base = Config()
    same = apply_overrides(base, ["--run.name=other", "--train.seed=7", "--data.train_files=/elsewhere"])
    assert config_digest(same.to_dict(), 1) == config_digest(base.to_dict(), 1)
    deeper = apply_overrides(base, ["--model.depth=6"])
    assert config_digest(deeper.to_dict(), 1) != config_digest(base.to_dict(), 1)
    assert config_digest(base.to_dict(), 4) != config_digest(base.to_dict(), 1)


def test_a_run_opens_the_cache_only_where_code_is_compiled(tmp_path, monkeypatch):
    from speedgpt.parallel.dist import DistInfo
    from speedgpt.train.compile import open_compile_cache

    # set here so that monkeypatch puts back what the process had after the test (activate() sets both)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "before"))
    dist = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    lines: list[str] = []
    on = apply_overrides(Config(), ["--train.compile=true", f"--train.compile_cache={tmp_path / 'c'}"])
    cache = open_compile_cache(on, dist, lines.append)
    assert cache.folder.parent == tmp_path / "c"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache.folder / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(cache.folder / "triton")
    assert any("nothing saved" in line for line in lines)
    for extra in (["--train.compile_backend=eager"], ["--train.compile=false"], ["--train.compile_cache=off"]):
        assert open_compile_cache(apply_overrides(on, extra), dist, lines.append) is None
