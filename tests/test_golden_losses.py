"""Bit-equal training and validation losses of short CPU runs, against values recorded at commit 3f4c49e.

A guard for refactors that must not change the math: every per-step training loss and every
validation loss of each run below must equal the recorded float exactly (compared as float.hex).
The data are synthetic and generated here from a seed, so the result depends only on the code,
the PyTorch build and the CPU. A legitimate numerics change re-records the values with
`PYTHONPATH=. python tests/test_golden_losses.py --record` and says why in its commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "golden_losses.json"

COMMON = [
    "--model.depth=4", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=2",
    "--data.seq_len=64", "--data.val_tokens=2048", "--train.batch_tokens=512", "--train.micro_batch_size=4",
    "--train.steps=20", "--train.val_every=5", "--train.log_every=5", "--train.device=cpu",
    "--train.dtype=float32", "--run.report=false", "--run.sample_tokens=0", "--schedule.window_block=16",
    "--optim.muon_momentum_warmup_steps=8",
    # The values were recorded with the records' cropping rows (the default before data.long_docs); the
    # split rows have their own exactness tests (tests/test_loader_split.py).
    "--data.long_docs=crop",
]
# Each run exercises a different part of the model and the optimizers. Windows stay constant over a
# run, so validation scores the same windows whichever step's windows it uses.
RUNS = {
    "dense": ["--model.window_pattern=LS", "--schedule.window_start=64", "--schedule.window_end=64",
              "--model.attn_gate=true", "--model.logit_softcap=15.0", "--train.warmup_steps=2"],
    "switches": ["--model.window_pattern=SL", "--schedule.window_start=32", "--schedule.window_end=32",
                 "--model.attn_free_layers=[2]", "--model.unet_skips=false", "--optim.muon_ortho=polar_express",
                 "--optim.normuon=true", "--optim.muon_weight_decay=0.05", "--optim.cautious_wd=true",
                 "--optim.wd_schedule=lr", "--optim.grad_clip=1.0", "--optim.adam_weight_decay=0.01",
                 "--schedule.kind=warmup_cosine", "--schedule.warmup_frac=0.2"],
}


def synthetic_shards(out: Path) -> Path:
    """Documents of a learnable token process (each token a function of the previous one plus noise),
    each starting with BOS, from a fixed seed: the same bytes on every machine."""
    from speedgpt.data.shards import write_shard
    from speedgpt.data.tokenizer import BOS_ID

    rng = np.random.default_rng(20261124)
    tokens: list[int] = []
    while len(tokens) < 60_000:
        n = int(rng.integers(20, 400))
        doc = [int(rng.integers(0, 4096))]
        for noise in rng.integers(0, 6, size=n - 1):
            doc.append((doc[-1] * 31 + int(noise) * 977) % 4096)
        tokens += [BOS_ID] + doc
    arr = np.array(tokens, dtype=np.uint16)
    out.mkdir(parents=True, exist_ok=True)
    split = int(np.flatnonzero(arr[:50_000] == BOS_ID)[-1])
    write_shard(out / "train_000000.bin", arr[:split])
    write_shard(out / "val_000000.bin", arr[split:])
    return out


def run_losses(name: str, shards: Path, run_dir: Path) -> dict:
    import torch

    from speedgpt.config import apply_overrides, load_preset
    from speedgpt.train.loop import train

    cfg = apply_overrides(load_preset("tiny-cpu"), COMMON + RUNS[name] + [f"--data.train_files={shards}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same reduction order in every process
    try:
        result = train(cfg, run_dir=run_dir, quiet=True)
    finally:
        torch.set_num_threads(threads)
    return {"train": [float(x).hex() for x in result.train_losses],
            "val": [[step, float(v).hex()] for step, v in result.val_history]}


@pytest.mark.parametrize("name", list(RUNS))
def test_losses_are_bit_equal_to_the_recorded_ones(name, tmp_path):
    golden = json.loads(FIXTURE.read_text())[name]
    got = run_losses(name, synthetic_shards(tmp_path / "data"), tmp_path / "run")
    assert got["train"] == golden["train"], "training losses differ from the recorded ones (float.hex)"
    assert got["val"] == golden["val"], "validation losses differ from the recorded ones (float.hex)"


if __name__ == "__main__":  # re-record: python tests/test_golden_losses.py --record
    import tempfile

    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: PYTHONPATH=. python tests/test_golden_losses.py --record")
    with tempfile.TemporaryDirectory() as tmp:
        shards = synthetic_shards(Path(tmp) / "data")
        record = {name: run_losses(name, shards, Path(tmp) / name) for name in RUNS}
    FIXTURE.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {FIXTURE}")
