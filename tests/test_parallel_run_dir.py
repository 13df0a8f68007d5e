"""`speedgpt train` on 2 gloo ranks without --run-dir: every rank writes into rank 0's default directory.

Each rank named runs/<name>-<time> by its own clock; two ranks a second apart wrote into two folders (rank 1's
DCP shards beside no config, rank 0's checkpoint missing them). Here the ranks' clocks disagree on purpose.
"""

import os
import types

from distkit import spawn_local
from test_parallel_train import make_shards, run_overrides


def _cli_worker(rank, world, root, argv):
    import speedgpt.rundir as rundir
    from speedgpt.cli import main

    os.chdir(root)
    # This rank's clock for the default name (rundir.default_run_dir): a second apart from the other rank's
    rundir.time = types.SimpleNamespace(strftime=lambda fmt: f"20260101-00000{rank}")
    assert main(argv) == 0, f"rank {rank}: speedgpt train failed"


def test_ranks_without_run_dir_write_into_rank_0s_default_directory(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    data = make_shards(tmp_path / "data")
    # dcp: every rank writes its own shards of each checkpoint into the run directory
    argv = ["train", "--preset", "tiny-cpu", *run_overrides(data), "--train.steps=2", "--train.checkpoint_every=0",
            "--train.checkpoint_format=dcp"]
    spawn_local(_cli_worker, 2, str(tmp_path), argv)
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["tiny-cpu-20260101-000000"], runs  # rank 0's name; none from rank 1's clock
    run = tmp_path / "runs" / runs[0]
    assert (run / "config.toml").is_file() and (run / "metrics.jsonl").is_file()
    assert len(list((run / "checkpoints" / "step_000002" / "dcp").glob("*.distcp"))) == 2  # both ranks' shards

    # The same directory again by name, replaced: rank 0 checks and clears it, rank 1 takes it as it is.
    spawn_local(_cli_worker, 2, str(tmp_path), [*argv, "--run-dir", f"runs/{runs[0]}", "--overwrite"])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs
    assert len(list((run / "checkpoints" / "step_000002" / "dcp").glob("*.distcp"))) == 2
