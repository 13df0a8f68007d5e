"""Shard format: round trip, every rejection, shard discovery."""

import numpy as np
import pytest
import torch

from speedgpt.data import shards
from speedgpt.data.shards import ShardError, find_shards, load_shard, read_header, write_shard


def test_round_trip_bytes_and_values(tmp_path):
    tokens = np.array([50256, 0, 1, 65535, 300, 50256, 7], dtype=np.int64)
    path = tmp_path / "train_000000.bin"
    assert write_shard(path, tokens) == len(tokens)
    raw = path.read_bytes()
    # The layout is pinned byte for byte: little-endian int32 header, then uint16 tokens.
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == 20240520 and header[1] == 1 and header[2] == len(tokens)
    assert (header[3:] == 0).all()
    assert np.array_equal(np.frombuffer(raw[1024:], dtype="<u2"), tokens)
    assert len(raw) == 1024 + 2 * len(tokens)
    assert read_header(path) == len(tokens)
    loaded = load_shard(path)
    assert loaded.dtype == torch.uint16
    assert loaded.to(torch.int64).tolist() == tokens.tolist()
    # torch and list inputs produce the same file.
    write_shard(tmp_path / "b.bin", torch.tensor(tokens))
    write_shard(tmp_path / "c.bin", tokens.tolist())
    assert (tmp_path / "b.bin").read_bytes() == raw == (tmp_path / "c.bin").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp files left


def test_empty_shard(tmp_path):
    write_shard(tmp_path / "e.bin", [])
    assert read_header(tmp_path / "e.bin") == 0
    assert load_shard(tmp_path / "e.bin").numel() == 0


def test_write_rejects_out_of_range(tmp_path):
    with pytest.raises(ValueError, match="uint16"):
        write_shard(tmp_path / "x.bin", [1, 70000])
    with pytest.raises(ValueError, match="uint16"):
        write_shard(tmp_path / "x.bin", [-1])
    assert not (tmp_path / "x.bin").exists()


def _good(tmp_path, n=10):
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(n) % 100)
    return path


def test_rejects_bad_magic(tmp_path):
    path = _good(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[0:4] = np.array([12345], dtype="<i4").tobytes()
    path.write_bytes(bytes(raw))
    for fn in (read_header, load_shard):
        with pytest.raises(ShardError, match=r"s\.bin has magic 12345.*delete it and download/tokenize again"):
            fn(path)
    # text given where shards belong (eval --data corpus.jsonl) is not to be deleted: it is tokenized first
    text = tmp_path / "corpus.jsonl"
    for size in (1, 100):  # shorter than a header, and longer
        text.write_text('{"text": "a document of the user"}\n' * size)
        with pytest.raises(ShardError, match=r"if it is text, tokenize it first \(speedgpt data tokenize .*corpus"):
            read_header(text)


def test_rejects_bad_version(tmp_path):
    path = _good(tmp_path)
    raw = bytearray(path.read_bytes())
    raw[4:8] = np.array([7], dtype="<i4").tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"s\.bin has format version 7"):
        load_shard(path)


def test_rejects_truncated_and_oversized(tmp_path):
    path = _good(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[:-2])
    with pytest.raises(ShardError, match=r"s\.bin is truncated"):
        read_header(path)
    path.write_bytes(raw[:100])
    with pytest.raises(ShardError, match=r"s\.bin is truncated"):
        load_shard(path)
    path.write_bytes(raw + b"\0\0")
    with pytest.raises(ShardError, match="longer than its header"):
        read_header(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_header(tmp_path / "missing.bin")


def test_rejects_token_outside_vocab(tmp_path):
    path = tmp_path / "v.bin"
    write_shard(path, [50256, 5, 50257, 3])
    assert load_shard(path).numel() == 4  # the check is opt-in
    with pytest.raises(ShardError, match=r"v\.bin has token id 50257 >= vocab_size 50257 "
                                         r"\(first at position 2, byte 1028\)"):
        load_shard(path, vocab_size=50257)
    load_shard(path, vocab_size=50304)


def test_header_is_little_endian_constant():
    assert shards.HEADER_BYTES == 1024 and shards.MAGIC == 20240520 and shards.VERSION == 1


def test_find_shards(tmp_path):
    for name in ["train_000001.bin", "train_000000.bin", "val_000000.bin", "notes.txt"]:
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in find_shards(tmp_path, "train")] == ["train_000000.bin", "train_000001.bin"]
    assert [p.name for p in find_shards(tmp_path, "val")] == ["val_000000.bin"]
    assert len(find_shards(tmp_path, None)) == 3
    assert [p.name for p in find_shards(str(tmp_path / "*_000000.bin"))] == ["train_000000.bin", "val_000000.bin"]
    with pytest.raises(FileNotFoundError, match="no test shards"):
        find_shards(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match=r"no files match .*nothing\*\.bin"):
        find_shards(str(tmp_path / "nothing*.bin"))


def test_check_token_ids_names_the_first_offender_without_loading(tmp_path):
    path = tmp_path / "val_000000.bin"
    write_shard(path, [50256, 7, 60000, 50300, 3])
    shards.check_token_ids(path, 60001)
    with pytest.raises(ShardError, match=r"val_000000\.bin has token id 60000 >= vocab_size 50257 "
                                         r"\(first at position 2, byte 1028\)") as e:
        shards.check_token_ids(path, 50257)
    assert e.value.offset == 1028
    write_shard(path, [50256, 7, 50300])  # below the padded embedding (50304), still no GPT-2 token
    with pytest.raises(ShardError, match=r"token id 50300 >= vocab_size 50257 \(first at position 2"):
        shards.check_token_ids(path, 50257)


def test_a_directory_of_train_shards_only_names_data_val_files_as_the_other_fix(tmp_path):
    """`data tokenize --val-fraction 0` writes train shards only: training's refusal named only re-tokenizing."""
    from types import SimpleNamespace

    from speedgpt.data.shards import given_shards

    write_shard(tmp_path / "train_000000.bin", [1, 2, 3])
    with pytest.raises(FileNotFoundError, match=r"has no val shards .*--data\.val_files=DIR_OR_GLOB"):
        given_shards(SimpleNamespace(train_files=str(tmp_path), val_files=""))
    with pytest.raises(FileNotFoundError) as e:  # a glob that matches nothing: no such hint
        find_shards(str(tmp_path / "val_*.bin"), "val")
    assert "--data.val_files" not in str(e.value)


def test_validation_never_scores_the_training_files(tmp_path):
    """A glob or a file as data.train_files with no data.val_files: find_shards takes a glob literally, so
    validation scored the training files themselves, and the val loss looked like any other."""
    from types import SimpleNamespace

    from speedgpt.data.shards import given_shards, given_shards_problem

    write_shard(tmp_path / "train_000000.bin", [1, 2, 3])
    write_shard(tmp_path / "val_000000.bin", [4, 5, 6])
    for train in (str(tmp_path / "train_*.bin"), str(tmp_path / "train_000000.bin"), str(tmp_path / "*.bin")):
        with pytest.raises(ValueError, match=r"names files, not a directory, and data.val_files is not given"):
            given_shards(SimpleNamespace(train_files=train, val_files=""))
    both = SimpleNamespace(train_files=str(tmp_path / "*.bin"), val_files=str(tmp_path / "val_*.bin"))
    assert "1 shard(s) are both training and validation data" in given_shards_problem(both)  # ab's, sweep's check
    train, val = given_shards(SimpleNamespace(train_files=str(tmp_path / "train_*.bin"),
                                              val_files=str(tmp_path / "val_*.bin")))
    assert (train, val) == ([tmp_path / "train_000000.bin"], [tmp_path / "val_000000.bin"])
    assert given_shards(SimpleNamespace(train_files=str(tmp_path), val_files="")) == (train, val)  # a directory
