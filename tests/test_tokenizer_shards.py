"""Shards carry their tokenizer: the header stamp (vocabulary, BOS, identity; none = GPT-2), 32-bit
ids for vocabularies over 65,536, `data tokenize --tokenizer`, and training's refusal of shards
from two tokenizers."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from speedgpt.cli import main
from speedgpt.data.shards import (HEADER_BYTES, ShardError, TokenizerStamp, load_shard, read_header, read_shard_info,
                                  write_shard)
from speedgpt.tokenizer.core import id64
from speedgpt.tokenizer.shards import GPT2_STAMP, shards_stamp, shards_tokenizer, stamp_of
from tokkit import SAMPLES, corpus_docs, train_small, write_jsonl


def test_the_header_records_the_tokenizer_and_old_shards_read_as_gpt2(tmp_path):
    stamp = TokenizerStamp(512, 511, id64("fedcba9876543210" + "0" * 48))  # a sha256's first 8 bytes
    assert stamp.short_id == "fedcba9876543210"
    write_shard(tmp_path / "new.bin", [511, 3, 4], tokenizer=stamp)
    header = np.frombuffer((tmp_path / "new.bin").read_bytes()[:HEADER_BYTES], dtype="<i4")
    assert header[1] == 1 and header[3] == 512 and header[4] == 511 and (header[7:] == 0).all()
    info = read_shard_info(tmp_path / "new.bin")
    assert info.stamp == stamp and info.token_bytes == 2 and info.n_tokens == 3
    write_shard(tmp_path / "old.bin", [50256, 5, 6])  # as every shard before tokenizers were recorded
    assert read_shard_info(tmp_path / "old.bin").stamp is None
    assert shards_stamp([tmp_path / "old.bin"]) == GPT2_STAMP
    with pytest.raises(ValueError, match=r"two tokenizers: .*new\.bin from tokenizer fedcba9876543210 .*old\.bin "
                                         r"from gpt2"):
        shards_stamp([tmp_path / "new.bin", tmp_path / "old.bin"])


def test_32_bit_shards_for_vocabularies_over_65536(tmp_path):
    big = TokenizerStamp(70_000, 69_999, 7)
    ids = np.array([69_999, 0, 65_535, 65_536, 69_998, 300], dtype=np.int64)
    write_shard(tmp_path / "w.bin", ids, tokenizer=big)
    raw = (tmp_path / "w.bin").read_bytes()
    assert np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")[1] == 2  # version 2: the speedrun's reader refuses it
    assert len(raw) == HEADER_BYTES + 4 * len(ids)
    loaded = load_shard(tmp_path / "w.bin")
    assert loaded.dtype == torch.uint32 and loaded.to(torch.int64).tolist() == ids.tolist()
    with pytest.raises(ShardError, match="token id 69999 >= vocab_size 69000"):
        load_shard(tmp_path / "w.bin", vocab_size=69_000)
    (tmp_path / "cut.bin").write_bytes(raw[:-2])
    with pytest.raises(ShardError, match="truncated"):
        read_header(tmp_path / "cut.bin")
    # Ids are never wrapped: past the recorded vocabulary, or past uint16 without a tokenizer.
    with pytest.raises(ValueError, match=r"must be in \[0, 69999\].*not ids of the recorded tokenizer"):
        write_shard(tmp_path / "x.bin", [70_000], tokenizer=big)
    with pytest.raises(ValueError, match="uint16"):
        write_shard(tmp_path / "x.bin", [65_536])
    # A vocabulary of exactly 65,536 ids still fits uint16.
    write_shard(tmp_path / "n.bin", [65_535], tokenizer=TokenizerStamp(65_536, 65_535, 7))
    assert read_shard_info(tmp_path / "n.bin").token_bytes == 2


@pytest.fixture(scope="module")
def big_tokenizer(tmp_path_factory):
    """A 65,793-id tokenizer: every byte pair is a merge, and the last 256 (ids 65,536 and up) are pairs
    of lowercase letters, so English text encodes to ids that need 32 bits."""
    from speedgpt.tokenizer.folder import write_folder
    from speedgpt.tokenizer.patterns import NANOCHAT

    letters = [bytes([a, b]) for a, b in itertools.product(range(97, 123), repeat=2)][:256]
    chosen = set(letters)
    pairs = [bytes([a, b]) for a, b in itertools.product(range(256), repeat=2) if bytes([a, b]) not in chosen]
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({p: 256 + i for i, p in enumerate(pairs + letters)})
    return write_folder(tmp_path_factory.mktemp("big") / "big", ranks, NANOCHAT, name="big", pattern_name="nanochat")


def test_data_tokenize_writes_and_training_reads_32_bit_shards(big_tokenizer, tmp_path):
    from speedgpt.data.loader import TokenLoader
    from speedgpt.data.val import val_batches

    tok = big_tokenizer
    assert tok.vocab_size == 65_793 and tok.token_dtype == np.uint32
    assert max(tok.encode("ab ac ad")) >= 65_536
    docs = [f"{SAMPLES[0]} abacadaeafagahai {i}" for i in range(40)]
    data = write_jsonl(tmp_path / "d.jsonl", docs)
    assert main(["data", "tokenize", str(data), "--out", str(tmp_path / "out"), "--tokenizer", str(tok.folder),
                 "--workers", "1", "--val-fraction", "0.2"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["params"]["format_version"] == 2 and manifest["tokenizer"]["vocab_size"] == 65_793
    train = tmp_path / "out" / "train_000000.bin"
    info = read_shard_info(train)
    assert info.token_bytes == 4 and info.stamp == stamp_of(tok)
    ids = load_shard(train).to(torch.int64)
    assert int(ids.max()) >= 65_536
    first_doc = ids[: int(torch.nonzero(ids[1:] == tok.bos_id)[0]) + 1].tolist()
    assert tok.decode(first_doc[1:]) in docs
    # The loader and validation hand the 32-bit ids over unchanged.
    loader = TokenLoader(tmp_path / "out", seq_len=16, batch_size=2, prefetch=False, bos_id=tok.bos_id,
                         vocab_size=tok.vocab_size)
    inputs, targets = loader.next_batch()
    stream = ids.tolist()
    assert inputs[0].tolist() == stream[:16] and targets[0].tolist() == stream[1:17]
    val_ids = load_shard(tmp_path / "out" / "val_000000.bin").to(torch.int64).tolist()
    vin, vtg = next(iter(val_batches(tmp_path / "out", seq_len=8, batch_size=1, max_tokens=8)))
    assert vin[0].tolist() == val_ids[:8] and vtg[0].tolist() == val_ids[1:9]
    assert shards_tokenizer([train]).sha256 == tok.sha256  # found next to the shards


def test_data_tokenize_with_a_tokenizer_is_deterministic_and_carries_it(tmp_path):
    tok = train_small(tmp_path)
    data = write_jsonl(tmp_path / "d.jsonl", corpus_docs(10))
    outs = []
    for workers in (1, 2):  # two workers load the tokenizer from its folder
        out = tmp_path / f"w{workers}"
        assert main(["data", "tokenize", str(data), "--out", str(out), "--tokenizer", str(tok.folder),
                     "--workers", str(workers), "--val-fraction", "0.1"]) == 0
        outs.append(out)
    for name in ("train_000000.bin", "val_000000.bin"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes()
    assert (outs[0] / "tokenizer" / "tokenizer.json").read_bytes() == (tok.folder / "tokenizer.json").read_bytes()
    manifest = json.loads((outs[0] / "manifest.json").read_text())
    assert manifest["tokenizer"] == {"name": "tok", "vocab_size": 512, "bos_id": 511, "sha256": tok.sha256,
                                     "folder": "tokenizer"}
    ids = load_shard(outs[0] / "train_000000.bin").to(torch.int64).tolist()
    docs = [list(g) for k, g in itertools.groupby(ids, lambda t: t == tok.bos_id) if not k]
    originals = set(corpus_docs(10))
    assert all(tok.decode(d) in originals for d in docs)
    # Tokenizing the folder again with GPT-2 takes the old tokenizer copy away with the old shards.
    assert main(["data", "tokenize", str(data), "--out", str(outs[0]), "--workers", "1"]) == 0
    assert not (outs[0] / "tokenizer").exists()
    assert shards_stamp([outs[0] / "train_000000.bin"]) == GPT2_STAMP


def test_training_refuses_shards_of_two_tokenizers_in_one_line(tmp_path, capsys):
    tok = train_small(tmp_path)
    data = write_jsonl(tmp_path / "d.jsonl", corpus_docs(4))
    assert main(["data", "tokenize", str(data), "--out", str(tmp_path / "a"), "--tokenizer", str(tok.folder),
                 "--workers", "1"]) == 0
    assert main(["data", "tokenize", str(data), "--out", str(tmp_path / "b"), "--workers", "1"]) == 0
    capsys.readouterr()
    base = ["train", "--preset", "tiny-cpu", "--train.device=cpu", f"--data.val_files={tmp_path / 'a'}"]
    assert main([*base, f"--data.train_files={tmp_path}/*/train_*.bin", "--run-dir", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two tokenizers" in err[0], err
    assert f"{tmp_path / 'a' / 'train_000000.bin'} from tokenizer {tok.short_id}" in err[0]
    assert f"{tmp_path / 'b' / 'train_000000.bin'} from gpt2" in err[0]
    assert not (tmp_path / "r1").exists()
    # Shards whose tokenizer folder is gone, or given the wrong one: one line naming the fix.
    import shutil

    shutil.rmtree(tmp_path / "a" / "tokenizer")
    assert main([*base, f"--data.train_files={tmp_path / 'a'}", "--run-dir", str(tmp_path / "r2")]) == 2
    assert "no tokenizer folder is next to them" in capsys.readouterr().err
    other = train_small(tmp_path, vocab_size=300, name="other")
    assert main([*base, f"--data.train_files={tmp_path / 'a'}", f"--data.tokenizer={other.folder}",
                 "--run-dir", str(tmp_path / "r3")]) == 2
    assert "but the shards in" in capsys.readouterr().err
    # A tokenizer named for the default corpus (GPT-2's) is a mistake, not ignored.
    assert main(["train", "--preset", "tiny-cpu", "--train.device=cpu", f"--data.tokenizer={other.folder}",
                 "--run-dir", str(tmp_path / "r4")]) == 2
    assert "data.train_files, which is empty" in capsys.readouterr().err
