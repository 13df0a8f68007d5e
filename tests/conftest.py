"""Shared fixtures: small real-text shards and tiny model configs for fast CPU tests."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest

TINY_OVERRIDES = [
    "--model.depth=2", "--model.model_dim=64", "--model.head_dim=16", "--model.value_embeds=1",
    "--data.seq_len=64", "--train.batch_tokens=512", "--train.steps=12", "--train.log_every=4",
    "--train.val_every=6", "--data.val_tokens=2048", "--train.device=cpu", "--run.report=false",
    "--run.sample_tokens=0", "--schedule.window_start=64", "--schedule.window_end=64",
    "--schedule.window_block=16", "--optim.muon_momentum_warmup_steps=5",
]


# The ways a run's config.toml is lost (a full disk, a copy that stopped, a stray edit, a removal): none is a run's.
CONFIG_DAMAGE = ("empty", "cut short", "not TOML", "removed")


def damage_run_config(run_dir: Path, how: str) -> None:
    path = run_dir / "config.toml"
    text = path.read_text()
    if how == "removed":
        path.unlink()
    else:
        path.write_text({"empty": "", "cut short": text[:text.index("\n[train]")],
                         "not TOML": text.replace("\n[train]", "\n[train", 1)}[how])


def pytest_configure(config):
    """Under pytest-xdist (the README's `-n auto`), each worker gets its share of the cores: N workers each
    running torch's default of one thread per core, and the processes they start, would oversubscribe them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # CLI subprocesses and spawned ranks inherit it
        import torch

        torch.set_num_threads(threads)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: the runs are cut from what is left
def pytest_collection_modifyitems(config, items):
    """Under `-n N` (tuned for the README's `--dist worksteal`; a worker cannot see the mode: xdist sets its
    own to "no"), the slow modules first, dealt out so that the N workers finish together
    (tests/schedkit.py says how); in one process the order stays as collected."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import schedkit

        seconds = schedkit.read_durations(schedkit.SLOW_TESTS.read_text())
        items[:] = [items[i] for i in schedkit.worksteal_order([item.nodeid for item in items], seconds, workers)]


@pytest.fixture
def one_thread():
    """Tiny matmuls on a shared 2-core machine: a second OpenMP thread only adds contention."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_offline(tmp_path_factory):
    """No network, and transformers' copy of the folders' code in a temporary directory (read when
    transformers is first imported: only the tests that use this fixture import it)."""
    import os

    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_MODULES_CACHE": str(tmp_path_factory.mktemp("hf_modules"))}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def text_shards(tmp_path_factory) -> Path:
    """train/val shards of GPT-2 tokens from the interpreter's own stdlib sources (deterministic)."""
    from speedgpt.data.shards import write_shard
    from speedgpt.data.tokenizer import BOS_ID, get_tokenizer

    enc = get_tokenizer()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokens: list[int] = []
    for path in sorted(stdlib.glob("*.py"))[:80]:
        tokens.append(BOS_ID)
        tokens += enc.encode_ordinary(path.read_text(errors="replace"))
        if len(tokens) > 400_000:
            break
    arr = np.array(tokens, dtype=np.uint16)
    out = tmp_path_factory.mktemp("shards")
    split = len(arr) - 40_000
    split = int(np.flatnonzero(arr[:split] == BOS_ID)[-1])  # cut at a document start
    write_shard(out / "train_000000.bin", arr[:split])
    write_shard(out / "val_000000.bin", arr[split:])
    return out


@pytest.fixture
def tiny_cfg(text_shards):
    from speedgpt.config import apply_overrides, load_preset

    return apply_overrides(load_preset("tiny-cpu"), TINY_OVERRIDES + [f"--data.train_files={text_shards}"])


@pytest.fixture(scope="session")
def counting_shards(tmp_path_factory) -> Path:
    """tests/test_parallel_train.py's counting documents (ids 0..63, BOS 64)."""
    from test_parallel_train import make_shards

    return make_shards(tmp_path_factory.mktemp("counting") / "data")


def counting_overrides(shards: Path) -> list[str]:
    """TINY_OVERRIDES on the counting documents with their 65-id vocabulary, for tests that compare runs with
    each other rather than learn real text: GPT-2's 50K-id head, loss, tables, their optimizer state and
    checkpoints cost about 30x this model's blocks."""
    from test_parallel_train import BOS

    return TINY_OVERRIDES + [f"--data.train_files={shards}", f"--model.vocab_size={BOS + 1}", f"--model.bos_id={BOS}"]


@pytest.fixture
def small_vocab_cfg(counting_shards):
    """tiny_cfg's model and run on the counting documents (counting_overrides)."""
    from speedgpt.config import apply_overrides, load_preset

    return apply_overrides(load_preset("tiny-cpu"), counting_overrides(counting_shards))
