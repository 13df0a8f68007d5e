"""The package's structure: who may import whom, and one way to build a model."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

PACKAGE = Path(__file__).resolve().parents[1] / "speedgpt"


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the speedgpt modules a file imports (relative imports resolved)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("speedgpt")}


def imports_of(subpackage: str) -> dict[str, set[str]]:
    root = PACKAGE / subpackage
    files = [root.with_suffix(".py")] if root.with_suffix(".py").is_file() else sorted(root.rglob("*.py"))
    return {str(f.relative_to(PACKAGE)): imported_modules(f) for f in files}


@pytest.mark.parametrize("reader", ["eval", "infer", "report", "rundir", "export", "hf"])
def test_readers_of_runs_do_not_import_the_trainer(reader):
    bad = {f: sorted(m for m in mods if m.startswith("speedgpt.train")) for f, mods in imports_of(reader).items()}
    assert not any(bad.values()), bad


def test_training_imports_neither_sampling_nor_reports():
    bad = {f: sorted(m for m in mods if m.startswith(("speedgpt.infer", "speedgpt.report")))
           for f, mods in imports_of("train").items()}
    assert not any(bad.values()), bad


def test_the_runtime_is_frozen_and_the_model_keeps_the_one_it_was_built_with():
    from speedgpt.config import load_preset
    from speedgpt.model.build import model_from_config

    cfg = load_preset("tiny-cpu")
    model = model_from_config(cfg, "cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.runtime.dtype = torch.bfloat16
    assert model.runtime.device == torch.device("cpu") and model.runtime.dtype == torch.float32
    assert model.windows == (128, 64) and model.loss_path == "torch"  # the schedule's final (long, short)
    assert all(block.attn.window_block == cfg.schedule.window_block for block in model.blocks)


def test_training_and_loading_build_the_same_model(tiny_cfg, tmp_path):
    from speedgpt.config import apply_overrides
    from speedgpt.infer.load import load_model
    from speedgpt.train.loop import train

    cfg = apply_overrides(tiny_cfg, ["--train.steps=2", "--train.val_every=0", "--model.window_pattern=LS",
                                     "--schedule.short_window_frac=0.25"])
    result = train(cfg, run_dir=tmp_path / "run", quiet=True)
    loaded, _ = load_model(tmp_path / "run", device="cpu")
    assert loaded.runtime == result.model.runtime  # dtype, backend, windows, FP8 choices, grad scale
    assert loaded.windows == result.model.windows == (64, 16)
