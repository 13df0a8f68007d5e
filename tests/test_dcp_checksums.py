"""DCP checkpoints (train.checkpoint_format=dcp / dcp_async) carry checksums and follow the retention
policy, like the single-file format: state.json records the size and SHA-256 of every file DCP
wrote; a flipped or truncated shard is a one-line error naming the file (resume, export); old
checkpoints go by train.keep_checkpoints and train.keep_checkpoint_every. One process, no group."""

import json
from pathlib import Path

import pytest

from speedgpt.config import apply_overrides
from speedgpt.rundir import dcp
from speedgpt.rundir.checkpoint import CheckpointError
from speedgpt.data.tokenizer import BOS_ID
from test_parallel_train import BOS, make_shards, run_cfg, run_here


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("dcpsum") / "data")


def dcp_cfg(data, fmt="dcp", *more, bos=BOS):
    return apply_overrides(run_cfg(data, bos=bos), [f"--train.checkpoint_format={fmt}", "--train.steps=4",
                                                    "--train.checkpoint_every=2", *more])


def shard_of(step_dir):
    (shard,) = sorted((step_dir / "dcp").glob("*.distcp"))
    return shard


@pytest.mark.parametrize("fmt", ["dcp", "dcp_async"])
def test_state_json_records_every_dcp_file(tmp_path, data, fmt):
    run_here(dcp_cfg(data, fmt), tmp_path / "run")
    step = tmp_path / "run" / "checkpoints" / "step_000004"
    state = json.loads((step / "state.json").read_text())
    on_disk = sorted(str(p.relative_to(step)) for p in (step / "dcp").iterdir())
    assert sorted(state["files"]) == on_disk == sorted(["dcp/.metadata", str(shard_of(step).relative_to(step))])
    for name, rec in state["files"].items():
        assert rec["bytes"] == (step / name).stat().st_size
    assert not list(step.glob(".manifest-*"))  # the parts were merged and removed
    dcp.verify(step)  # intact: no error


def flip_byte(path, offset=100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_corrupt_or_truncated_shard_is_an_error_naming_it(tmp_path):
    # GPT-2's ids: the export below checks the model's vocabulary against the run's tokenizer (GPT-2's) first
    cfg = dcp_cfg(make_shards(tmp_path / "data", bos=BOS_ID), bos=BOS_ID)
    run_here(cfg, tmp_path / "run")
    step = tmp_path / "run" / "checkpoints" / "step_000004"
    shard = shard_of(step)
    flip_byte(shard)
    with pytest.raises(CheckpointError, match=rf"{shard}.*corrupt.*delete {step}"):
        run_here(apply_overrides(cfg, ["--train.steps=6"]), tmp_path / "run", resume=True, extend=True)

    from speedgpt.export import export_model
    from speedgpt.rundir.weights import LoadError

    with pytest.raises(LoadError, match=rf"{shard}.*corrupt.*--checkpoint STEP"):
        export_model(tmp_path / "run", tmp_path / "export", dtype="fp32")

    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=rf"{shard} is truncated"):
        dcp.verify(step)


def test_manifest_shares_cover_every_file_whatever_the_world_size(tmp_path, data):
    run_here(dcp_cfg(data), tmp_path / "run")
    step = tmp_path / "run" / "checkpoints" / "step_000004"
    recorded = json.loads((step / "state.json").read_text())["files"]
    for rank in range(3):  # three ranks' shares of the same files: disjoint, together all of them
        dcp.write_manifest_part(step, rank, 3)
    assert dcp.merge_manifest(step, 3) == recorded


def test_dcp_pruning_keeps_last_k_and_every_m(tmp_path, data):
    cfg = dcp_cfg(data, "dcp_async", "--train.steps=6", "--train.checkpoint_every=1", "--train.keep_checkpoints=2",
                  "--train.keep_checkpoint_every=3")
    run_here(cfg, tmp_path / "run")
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert kept == ["step_000003", "step_000005", "step_000006"]


def _two_rank_worker(rank, world, root, out):
    """Each rank saves its half of a tensor (sync, then async), then every rank verifies after the
    test corrupts the second checkpoint: all ranks must raise the same error (none loads alone)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        state = {"model/w": torch.full((4,), float(rank)), f"model/only_rank{rank}": torch.arange(3.0)}
        dcp.save(Path(root), 1, state, {}, is_main=rank == 0).finish()
        dcp.save(Path(root), 2, state, {}, is_main=rank == 0, keep=0, background=True).finish()
        step2 = Path(root) / "step_000002"
        dcp.verify_on_ranks(step2)
        dist.barrier()
        if rank == 0:
            flip_byte(shard_of_rank(step2, 1), 10)
        dist.barrier()
        try:
            dcp.verify_on_ranks(step2)
            verdict = "no error"
        except CheckpointError as e:
            verdict = str(e)
        Path(out, f"rank{rank}.txt").write_text(verdict)
    finally:
        dist.destroy_process_group()


def shard_of_rank(step_dir, rank):
    return step_dir / "dcp" / f"__{rank}_0.distcp"


def test_two_ranks_record_every_file_and_raise_the_same_error(tmp_path, monkeypatch):
    from distkit import spawn_local

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    spawn_local(_two_rank_worker, 2, str(tmp_path / "ckpt"), str(tmp_path))
    for step in ("step_000001", "step_000002"):
        files = json.loads((tmp_path / "ckpt" / step / "state.json").read_text())["files"]
        assert sorted(files) == ["dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"], step
    verdicts = {(tmp_path / f"rank{r}.txt").read_text() for r in range(2)}
    assert len(verdicts) == 1
    (verdict,) = verdicts
    assert f"{shard_of_rank(tmp_path / 'ckpt' / 'step_000002', 1)} is corrupt" in verdict
