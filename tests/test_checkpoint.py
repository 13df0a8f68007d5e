"""Checkpoint hygiene: checksums, atomic writes, failing writes, retention, weights-only loading."""

import json
import pickle

import pytest
import torch

from speedgpt.atomic import atomic_write
from speedgpt.rundir import checkpoint as ckpt_mod
from speedgpt.rundir.checkpoint import (CheckpointError, CheckpointSaveError, checkpoints_to_delete,
                                       list_checkpoints, load_checkpoint, save_checkpoint)


def _save(root, step, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = {"w": torch.randn(128, 128, generator=g), "b": torch.randn(128, generator=g)}
    return save_checkpoint(root, step, model, [{"state": {}, "param_groups": []}], {"tokens": step}, keep=0)


def test_flipped_bytes_in_model_file_are_an_error_naming_the_file(tmp_path):
    path = _save(tmp_path, 1)
    f = path / "model.pt"
    data = bytearray(f.read_bytes())
    mid = len(data) // 2  # inside the tensor data, as a bad disk or a bad copy would do
    data[mid:mid + 4096] = bytes(b ^ 0xFF for b in data[mid:mid + 4096])
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"checkpoint file {f} is corrupt: its SHA-256 differs"):
        load_checkpoint(path)


def test_truncated_file_error_names_the_file_and_is_not_cut_off(tmp_path):
    path = _save(tmp_path, 1)
    f = path / "optim.pt"
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[: size // 2])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    msg = str(e.value)
    assert msg.startswith(f"checkpoint file {f} is truncated: {size // 2:,} bytes, {size:,} were written;")
    # the run's only checkpoint: no "previous checkpoint" to name (it named one that did not exist)
    assert msg.endswith(f"restore it, or start the run again: no earlier checkpoint is left in {path.parent} "
                        f"(`speedgpt train` can replace the run: --overwrite)")
    later = _save(tmp_path, 2)
    (later / "optim.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"delete .*step_0+2 to resume from the previous checkpoint \(step_0+1\)$"):
        load_checkpoint(later)
    # the first one again, now not the latest (a --checkpoint 1 of sample or export): a resume would load step 2
    with pytest.raises(CheckpointError, match=r"name another checkpoint with --checkpoint \(the run's latest is "
                                              r"step_0+2\)$"):
        load_checkpoint(path)
    sft = _save(tmp_path / "sft" / "checkpoints", 1)  # an SFT run's only checkpoint: sft has no --overwrite
    (tmp_path / "sft" / "sft.json").write_text("{}")
    (sft / "optim.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"start the SFT run again in a new --run-dir"):
        load_checkpoint(sft)


def test_intact_checkpoint_loads_back_exactly(tmp_path):
    path = _save(tmp_path, 3)
    model, optim, state = load_checkpoint(path)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(model["w"], torch.randn(128, 128, generator=g))
    assert state["step"] == 3 and state["tokens"] == 3 and set(state["files"]) == {"model.pt", "optim.pt"}


def test_failing_write_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch):
    first = _save(tmp_path, 1)
    real = ckpt_mod.atomic_write

    def failing(path, data):
        if path.name == "optim.pt":
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(ckpt_mod, "atomic_write", failing)
    with pytest.raises(CheckpointSaveError, match=f"could not write checkpoint step 2 .*No space left on device.*"
                                                  f"the previous checkpoint {first} is intact"):
        _save(tmp_path, 2)
    assert list_checkpoints(tmp_path) == [first]
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary directory left behind
    load_checkpoint(first)


def test_injected_save_error_via_environment(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    monkeypatch.setenv("SPEEDGPT_INJECT", "save_error@2")
    with pytest.raises(CheckpointSaveError, match="injected"):
        _save(tmp_path, 2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001"]


def test_stale_temporary_directories_are_never_picked_and_are_cleared(tmp_path):
    _save(tmp_path, 1)
    stale = tmp_path / ".tmp-step_000002-999"
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"half")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001"]
    _save(tmp_path, 3)
    assert not stale.exists()


def test_retention_keeps_last_k_and_every_m():
    assert checkpoints_to_delete([1, 2, 3, 4, 5, 6, 7], keep_last=2, keep_every=3) == [1, 2, 4, 5]
    assert checkpoints_to_delete([1, 2, 3], keep_last=0, keep_every=0) == []
    assert checkpoints_to_delete([10, 20, 30], keep_last=1, keep_every=0) == [10, 20]


def test_save_applies_retention(tmp_path):
    for step in range(1, 8):
        save_checkpoint(tmp_path, step, {}, [], {}, keep=2, keep_every=3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000003", "step_000006", "step_000007"]


class _RunsCode:
    def __reduce__(self):
        import os

        return (os.system, ("touch pwned",))


def test_a_foreign_checkpoint_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "ckpt" / "step_000001"
    path.mkdir(parents=True)
    (path / "model.pt").write_bytes(pickle.dumps(_RunsCode()))
    torch.save([], path / "optim.pt")
    (path / "state.json").write_text(json.dumps({"step": 1}))  # no checksums: an old or foreign checkpoint
    with pytest.raises(CheckpointError, match=f"checkpoint file {path / 'model.pt'} is unreadable"):
        load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


def test_atomic_write_failure_leaves_the_old_file(tmp_path):
    target = tmp_path / "f.bin"
    atomic_write(target, b"old")

    def broken(f):
        f.write(b"partial")
        raise OSError(5, "I/O error")

    with pytest.raises(OSError):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]


@pytest.mark.parametrize("error, says", [(OSError(28, "No space left on device"), "free space on that disk"),
                                         (OSError(5, "Input/output error"), "fix that")])
def test_a_failed_save_says_what_to_do_next(error, says, tmp_path, monkeypatch):
    ckpts = tmp_path / "run" / "checkpoints"

    def failing(path, data):
        raise error

    monkeypatch.setattr(ckpt_mod, "atomic_write", failing)
    with pytest.raises(CheckpointSaveError) as e:
        _save(ckpts, 1)
    assert str(e.value).endswith(f"no earlier checkpoint exists; {says} (with no checkpoint to resume from, a run "
                                 f"that stops here starts again with --overwrite)")
    monkeypatch.undo()
    _save(ckpts, 1)
    monkeypatch.setattr(ckpt_mod, "atomic_write", failing)
    with pytest.raises(CheckpointSaveError) as e:
        _save(ckpts, 2)
    assert str(e.value).endswith(f"step_000001 is intact; {says} (a run that stops here continues with "
                                 f"`speedgpt train --resume {tmp_path / 'run'}`)")
