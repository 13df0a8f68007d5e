"""The one token-shard format (see docs/format.md).

A shard is a 1024-byte header of 256 little-endian int32 followed by its token ids: ``[0]`` magic
20240520, ``[1]`` version (1: uint16 ids, 2: uint32 ids), ``[2]`` number of tokens, ``[3]`` vocabulary
size, ``[4]`` BOS id, ``[5:7]`` the tokenizer's identity (64 bits), rest zero. Zeros in ``[3:7]`` (the
speedrun's pre-tokenized FineWeb shards, and every shard written before tokenizers were recorded) mean
GPT-2, whose vocabulary (50257) and BOS (50256) those shards use; they load unchanged. Version 1 is
the speedrun's layout, so its code reads speedgpt's 16-bit shards; a vocabulary past 65,536 ids needs
version 2, which that code refuses rather than misreading.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, NamedTuple

import numpy as np

from ..atomic import atomic_file

if TYPE_CHECKING:  # torch is imported on use: tokenizing (and its worker processes) never needs it
    import torch

MAGIC = 20240520
VERSION = 1  # uint16 token ids (the speedrun's format)
VERSION_32 = 2  # uint32 token ids: vocabularies over 65,536
TOKEN_BYTES_OF = {VERSION: 2, VERSION_32: 4}
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
_MAX_TOKEN = 2**16 - 1  # uint16


class ShardError(ValueError):
    """A shard file that is not a valid shard; the message names the file and the fix. `offset`
    is the byte offset of the problem in the file, where known."""

    def __init__(self, message: str, offset: int | None = None):
        super().__init__(message)
        self.offset = offset


class TokenizerStamp(NamedTuple):
    """What a shard header records of its tokenizer: vocabulary size, BOS id and identity (the first
    8 bytes of the tokenizer's sha256, as an unsigned little-endian int; speedgpt.tokenizer.core)."""
    vocab_size: int
    bos_id: int
    id64: int

    @property
    def short_id(self) -> str:
        return self.id64.to_bytes(8, "little").hex()


class ShardInfo(NamedTuple):
    n_tokens: int
    token_bytes: int  # 2 (version 1) or 4 (version 2)
    stamp: TokenizerStamp | None  # None: not recorded (GPT-2)


def _header(n_tokens: int, version: int = VERSION, stamp: TokenizerStamp | None = None) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, version, n_tokens
    if stamp is not None:
        header[3], header[4] = stamp.vocab_size, stamp.bos_id
        header[5:7] = np.frombuffer(stamp.id64.to_bytes(8, "little"), dtype="<i4")
    return header.tobytes()


def write_shard(path: str | os.PathLike, tokens: Iterable[int] | np.ndarray | torch.Tensor, *,
                tokenizer: TokenizerStamp | None = None) -> int:
    """Write ``tokens`` as one shard at ``path`` atomically; returns the token count.

    ``tokenizer`` is recorded in the header, and every id must be below its vocabulary size; a
    vocabulary over 65,536 ids gets uint32 ids (version 2). Without it the header records nothing
    (read as GPT-2) and the ids must fit uint16. An id that does not fit is an error, never wrapped.
    The data goes to a temporary file in the same directory, is fsynced and then renamed over
    ``path``, so a crash never leaves a half-written shard under the final name.
    """
    path = Path(path)
    if hasattr(tokens, "detach"):  # a torch.Tensor
        tokens = tokens.detach().cpu().long().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"write_shard({path}): tokens must be 1-D, got shape {arr.shape}")
    wide = tokenizer is not None and tokenizer.vocab_size > _MAX_TOKEN + 1
    dtype = np.dtype("<u4" if wide else "<u2")
    top = tokenizer.vocab_size - 1 if tokenizer is not None else _MAX_TOKEN
    if arr.size and (tokenizer is not None or arr.dtype != np.uint16) and (arr.min() < 0 or arr.max() > top):
        fix = (f"they are not ids of the recorded tokenizer (vocab {tokenizer.vocab_size})" if tokenizer is not None
               else "use a vocabulary of at most 65536 tokens, or pass tokenizer= (32-bit shards)")
        raise ValueError(f"write_shard({path}): token ids must be in [0, {top}] to fit "
                         f"{'the vocabulary' if tokenizer is not None else 'uint16'}, got range "
                         f"[{arr.min()}, {arr.max()}]; {fix}")
    if arr.size >= 2**31:
        raise ValueError(f"write_shard({path}): {arr.size} tokens exceed the int32 header field; split the shard")
    arr = arr.astype(dtype, copy=False)
    with atomic_file(path) as f:
        f.write(_header(arr.size, VERSION_32 if wide else VERSION, tokenizer))
        f.write(arr.tobytes())
    return int(arr.size)


def read_shard_info(path: str | os.PathLike) -> ShardInfo:
    """Validate the header and the file size of the shard at ``path``; return its token count, token
    width and recorded tokenizer.

    Raises ``ShardError`` for a bad magic number, an unknown version, or a file whose size
    does not match the header (truncated download, or trailing garbage).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"shard {path} does not exist; check the path or re-create the data") from None
    # A .bin is a damaged shard; anything else is most likely the text itself, given where shards belong.
    fix = ("delete it and download/tokenize again" if path.suffix == ".bin" else
           f"if it is text, tokenize it first (speedgpt data tokenize {path} --out DIR) and pass DIR")
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"shard {path} is truncated: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte "
                         f"header; {fix}", offset=len(raw))
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC:
        raise ShardError(f"shard {path} has magic {int(header[0])}, expected {MAGIC}: not a token shard "
                         f"(see docs/format.md); {fix}", offset=0)
    if int(header[1]) not in TOKEN_BYTES_OF:
        raise ShardError(
            f"shard {path} has format version {int(header[1])}, this speedgpt reads versions "
            f"{', '.join(map(str, TOKEN_BYTES_OF))}; re-tokenize it with this version", offset=4
        )
    token_bytes = TOKEN_BYTES_OF[int(header[1])]
    n_tokens = int(header[2])
    expected = HEADER_BYTES + token_bytes * n_tokens
    if n_tokens < 0 or size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise ShardError(
            f"shard {path} is {what}: {size} bytes, header says {n_tokens} tokens = {expected} bytes; "
            "delete it and download/tokenize again", offset=min(size, expected)
        )
    stamp = _stamp(header)
    if stamp is not None:
        if not 0 <= stamp.bos_id < stamp.vocab_size:
            raise ShardError(f"shard {path} records BOS id {stamp.bos_id} outside its vocabulary of "
                             f"{stamp.vocab_size}: a damaged header; delete it and tokenize again", offset=12)
    return ShardInfo(n_tokens, token_bytes, stamp)


def read_header(path: str | os.PathLike) -> int:
    """The token count of the shard at ``path``, its header and size validated (read_shard_info)."""
    return read_shard_info(path).n_tokens


def claimed_info(path: str | os.PathLike) -> ShardInfo | None:
    """What a shard's header claims (token count, width, tokenizer) without checking the file size;
    None when the header itself is unreadable. For data that may hold a shard that broke after it
    was written (data.on_bad_shard=skip): the header still says what the shard was."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError:
        return None
    if len(raw) < HEADER_BYTES:
        return None
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC or int(header[1]) not in TOKEN_BYTES_OF:
        return None
    return ShardInfo(max(int(header[2]), 0), TOKEN_BYTES_OF[int(header[1])], _stamp(header))


def _stamp(header: np.ndarray) -> TokenizerStamp | None:
    if not header[3:7].any():
        return None
    return TokenizerStamp(int(header[3]), int(header[4]), int.from_bytes(header[5:7].tobytes(), "little"))


def claimed_tokens(path: str | os.PathLike) -> int:
    """The token count a shard's header claims (0 when the header itself is unreadable), without
    checking the file size: the stream layout of a shard that broke after training started."""
    info = claimed_info(path)
    return info.n_tokens if info is not None else 0


def load_shard(path: str | os.PathLike, pin_memory: bool = False, *, vocab_size: int | None = None) -> torch.Tensor:
    """The tokens of the shard at ``path`` as a 1-D ``torch.uint16`` tensor (``torch.uint32`` for a
    version-2 shard).

    Reads straight into the tensor's memory with ``readinto`` (no intermediate copy);
    ``pin_memory=True`` allocates that memory page-locked for fast async host→GPU copies.
    ``vocab_size`` (optional, costs one pass over the data) rejects ids >= vocab_size.
    """
    import torch

    path = Path(path)
    info = read_shard_info(path)
    n_tokens, width = info.n_tokens, info.token_bytes
    tokens = torch.empty(n_tokens, dtype=torch.uint16 if width == 2 else torch.uint32, pin_memory=pin_memory)
    buf = tokens.numpy()
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        n_read = f.readinto(memoryview(buf).cast("B")) if n_tokens else 0
    if n_read != width * n_tokens:
        raise ShardError(
            f"shard {path}: read {n_read} of {width * n_tokens} token bytes (file changed while reading?); "
            "check the file and load again", offset=HEADER_BYTES + n_read
        )
    if sys.byteorder == "big":  # the format is little-endian on disk
        buf.byteswap(inplace=True)
    if vocab_size is not None:
        _check_ids(buf, path, vocab_size, width)
    return tokens


def map_tokens(path: str | os.PathLike, info: ShardInfo | None = None) -> np.ndarray:
    """The shard's tokens as a read-only memory map (nothing read until used); `info`: its checked
    header when the caller has it (read_shard_info's ShardError otherwise)."""
    info = info or read_shard_info(path)
    if not info.n_tokens:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2" if info.token_bytes == 2 else "<u4", mode="r", offset=HEADER_BYTES,
                     shape=(info.n_tokens,))


def check_token_ids(path: str | os.PathLike, vocab_size: int) -> None:
    """ShardError (file, id, position and byte named) when the shard at ``path`` holds an id >=
    ``vocab_size``: load_shard's check without loading the shard. One max over a memory map; the
    first offender is looked for only when there is one."""
    info = read_shard_info(path)
    _check_ids(map_tokens(path, info), Path(path), vocab_size, info.token_bytes)


def _check_ids(ids: np.ndarray, path: Path, vocab_size: int, width: int) -> None:
    if not ids.size:
        return
    top = int(ids.max())
    if top >= vocab_size:
        pos = int(np.argmax(ids >= vocab_size))
        byte = HEADER_BYTES + width * pos
        raise ShardError(
            f"shard {path} has token id {top} >= vocab_size {vocab_size} (first at position {pos}, byte {byte}); "
            "it was tokenized with another vocabulary: re-tokenize it, or raise model.vocab_size",
            offset=byte,
        )


# The other fix for a directory without val shards (made with --val-fraction 0): `data tokenize` and training say it alike
OWN_VAL_SHARDS = "give training its own val shards with --data.val_files=DIR_OR_GLOB"


def find_shards(pattern_or_dir: str | os.PathLike, split: str | None = "train") -> list[Path]:
    """Resolve a directory or a glob into a sorted list of shard paths.

    A directory yields its ``*{split}_*.bin`` files (``train_000000.bin``,
    ``fineweb_train_000001.bin``, ...; all ``*.bin`` when ``split`` is None). A glob is
    taken literally (``split`` is ignored). Raises FileNotFoundError when nothing matches.
    """
    target = str(pattern_or_dir)
    if os.path.isdir(target):
        pattern = os.path.join(glob.escape(target), f"*{split}_*.bin" if split else "*.bin")
    else:
        pattern = target
    files = sorted(Path(p) for p in glob.glob(pattern) if os.path.isfile(p))
    if not files:
        where = f"directory {target} has no {split + ' ' if split else ''}shards ({os.path.basename(pattern)})" \
            if os.path.isdir(target) else f"no files match {target}"
        # (`data tokenize --val-fraction 0` writes a directory of train shards only, on purpose)
        own_val = f", {OWN_VAL_SHARDS}" if split == "val" and os.path.isdir(target) else ""
        raise FileNotFoundError(
            f"{where}; create them with `speedgpt data local-python`, `speedgpt data tokenize` "
            f"or `speedgpt data fineweb`{own_val}, or point to the right path"
        )
    return files


def val_from_train_problem(train_files: str, val_files: str) -> str | None:
    """Why validation cannot take its shards from `train_files`, or None. Only a directory has a val split
    (its ``*val_*.bin``): a glob or a file is taken literally, so with no `val_files` validation would score the
    training files themselves (a `fineweb_train_*.bin` glob did, and its val loss looked like any other)."""
    if val_files or not train_files or os.path.isdir(str(train_files)) or not glob.glob(str(train_files)):
        return None  # (a path that matches nothing: find_shards says so, with what to do)
    return (f"data.train_files={train_files} names files, not a directory, and data.val_files is not given: "
            f"validation would score the training files; give --data.val_files=GLOB_OR_DIR (e.g. a val_*.bin glob), "
            f"or pass the shards' directory as data.train_files (its val_*.bin are the val split)")


def given_shards(data, read_headers: bool = False) -> tuple[list[Path], list[Path]] | None:
    """The training and validation shards `data.train_files` / `data.val_files` name (FileNotFoundError when
    none match; ValueError when validation would read training files, val_from_train_problem, or both lists
    share one; `read_headers`: every header read too, ShardError for a file that is no shard); None when
    none are named: the run builds the default corpus itself. ab and sweep call it before launching runs, so
    a wrong path is one line, not a crash in every run."""
    if not data.train_files:
        return None
    problem = val_from_train_problem(data.train_files, data.val_files)
    if problem:
        raise ValueError(problem)
    train, val = find_shards(data.train_files, "train"), find_shards(data.val_files or data.train_files, "val")
    both = {p.resolve() for p in train} & {p.resolve() for p in val}
    if both:  # a val loss on files it trained on measures memory, not generalization
        raise ValueError(f"{len(both)} shard(s) are both training and validation data (e.g. {min(both)}); give "
                         f"data.train_files and data.val_files that share no file")
    if read_headers:
        for path in (*train, *val):
            read_shard_info(path)
    return train, val


def given_shards_problem(data) -> str | None:
    """What is wrong with the shards `data` names, as one line (every header read); None when they are usable
    or none are named. ab and sweep check this before launching any run."""
    try:
        given_shards(data, read_headers=True)
    except (FileNotFoundError, ValueError) as e:  # (ShardError is a ValueError)
        return str(e)
    return None
