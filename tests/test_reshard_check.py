"""scripts/dcp_reshard_check.py on CPU (gloo): a DCP checkpoint written on 2 ranks resumed on 1, the
real commands end to end, losses side by side (the GPU run: 4 ranks, dense-1b, nccl)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from speedgpt.tools.reshard_check import check_args, gpu_sets, loss_table, main, world_sizes

TINY = ["--model.depth=1", "--model.model_dim=32", "--model.head_dim=16", "--model.value_embeds=0",
        "--data.seq_len=64", "--train.batch_tokens=512", "--train.micro_batch_size=2", "--schedule.window_start=64",
        "--schedule.window_end=64", "--schedule.window_block=16", "--data.val_tokens=512", "--train.val_every=0"]


def test_checkpoint_of_two_ranks_resumes_on_one_with_the_same_losses(text_shards, tmp_path, capsys, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "check"
    assert main(["--workdir", str(work), "--steps", "2", "--more", "2", f"--data.train_files={text_shards}", *TINY]) == 0
    out = capsys.readouterr().out
    assert "2 rank(s): 4 steps with a DCP checkpoint at step 2" in out and "1 rank(s): resumed at step 2" in out
    rows = out.split("training loss after each step")[1].strip().splitlines()[2:4]
    assert [r.split()[0] for r in rows] == ["3", "4"]
    for row in rows:  # fp32 on CPU: equal up to the order of the ranks' reductions
        _, a, b, diff = row.split()
        assert float(a) == pytest.approx(float(b), rel=2e-4) and float(diff) < 1e-3
    assert (work / "ranks2" / "checkpoints" / "step_000002" / "dcp").is_dir()  # DCP shards were written
    from speedgpt.rundir.metrics import read_metrics

    resumes = [r["step"] for r in read_metrics(work / "ranks1") if r.get("event") == "resume"]
    assert resumes == [2]  # the copy held no checkpoint past step 2


def test_loss_table_puts_world_sizes_side_by_side():
    lines, worst = loss_table([4, 2, 1], {4: [3.0, 2.5], 2: [3.0, 2.5004], 1: [3.001, None]}, range(11, 13))
    assert lines[0].split() == ["step", "4", "rank(s)", "2", "rank(s)", "1", "rank(s)", "|2", "-", "4|", "|1", "-", "4|"]
    assert lines[1].split()[0] == "11" and lines[2].split()[3] == "-"
    assert worst[2] == pytest.approx(4e-4) and worst[1] != worst[1]  # a missing loss: nan, not 0


@pytest.mark.parametrize("change, says", [
    ({"nproc": 1}, "at least 2 ranks"),
    ({"more": 0}, "both must be >= 1"),
    ({"backend": "nccl", "nproc": 64}, "needs 64 GPUs"),
    ({"overrides": ["--train.batch_tokens=3"]}, "config error"),
])
def test_arguments_that_cannot_run_are_refused_first(tmp_path, change, says):
    args = SimpleNamespace(nproc=4, backend="gloo", preset="tiny-cpu", steps=2, more=2, workdir=str(tmp_path / "w"),
                           overrides=[])
    assert check_args(args) is None and world_sizes(4) == [4, 2, 1] and world_sizes(2) == [2, 1]
    assert says in check_args(SimpleNamespace(**{**vars(args), **change}))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "x").write_text("")
    assert "is not empty" in check_args(args)
    assert "is a file; pass a directory" in check_args(SimpleNamespace(**{**vars(args), "workdir": str(tmp_path / "w" / "x")}))


def test_resumed_runs_get_disjoint_gpus():
    assert gpu_sets([2, 1], {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == ["0,1", "2"]
    assert gpu_sets([4, 2, 1], {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"}) == ["7,6,5,4", "3,2", "1"]
