"""Run directories of every preset's architecture, scaled down for CPU, for the Hugging Face export tests.

A preset's [model] section is kept (its layer lists, windows pattern, switches), with a width of 32
(two heads of 16; grouped-query presets keep one key/value head) and GPT-2's vocabulary (BOS 50256
must be a token). The schedule grows the long window 16 -> 32 -> 48 tokens over the two steps, so
windows bite in rows of 64 and YaRN's state is not the identity. Weights are random, not trained:
speedgpt's init zeroes the output projections and the head, which would make any two models agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from evalkit import randomize, tiny_config, write_corpus
from speedgpt.config import load_preset, save_toml
from speedgpt.data.shards import load_shard
from speedgpt.data.tokenizer import BOS_ID
from speedgpt.model.build import build_model
from speedgpt.plan import validate
from speedgpt.rundir.checkpoint import save_checkpoint

SCHEDULE = ["--schedule.window_start=16", "--schedule.window_end=48", "--schedule.window_block=16"]


def scaled_model(preset: str):
    m = load_preset(preset).model
    return dataclasses.replace(m, model_dim=32, head_dim=16, num_heads=0, aspect_ratio=64,
                               num_kv_heads=1 if m.num_kv_heads else 0)


def preset_run(tmp_path: Path, preset: str, *, tied: bool = False) -> Path:
    """A run directory (config.toml + one checkpoint) of `preset`'s scaled-down architecture, random weights.
    `tied`: a tied-embedding model saved in its tied phase (the lookup reads the head)."""
    data = write_corpus(tmp_path / "data")
    run = tmp_path / "run"
    cfg = tiny_config(data, run, SCHEDULE)
    cfg.model = scaled_model(preset)
    validate(cfg)
    run.mkdir(parents=True)
    save_toml(cfg, run / "config.toml")
    model = build_model(cfg.model, cfg.data.seq_len, "cpu")
    randomize(model, seed=1)
    state = model.state_dict()
    g = torch.Generator().manual_seed(2)
    for k in state:
        if k.endswith("expert_bias"):  # a balancing bias that changes which experts win
            state[k] = torch.randn(state[k].shape, generator=g) * 0.1
        if k == "embed_untied":
            state[k] = torch.tensor(not tied)
    save_checkpoint(run / "checkpoints", cfg.train.steps, state, [], {"tokens": 512, "train_time_s": 1.0}, keep=0)
    return run


def text_rows(shards: Path, length: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Two batches of real text (conftest's stdlib shards): (single, multi). `single`: two rows that each
    start a document and hold no other BOS; `multi`: a document's start, then a row whose second
    document begins mid-row."""
    tokens = load_shard(shards / "val_000000.bin").long()
    starts = (tokens == BOS_ID).nonzero().flatten().tolist()
    whole = [s for s in starts if s + length <= len(tokens) and not (tokens[s + 1:s + length] == BOS_ID).any()]
    middle = [s for s in starts if s >= length // 2 and s + length // 2 <= len(tokens)]
    single = torch.stack([tokens[s:s + length] for s in whole[:2]])
    m = middle[1] - length // 2
    multi = torch.stack([tokens[whole[0]:whole[0] + length], tokens[m:m + length]])
    return single, multi
