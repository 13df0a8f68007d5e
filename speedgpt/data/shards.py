"""The one token-shard format (see docs/format.md).

A shard is a 1024-byte header of 256 little-endian int32 (``[0]`` magic 20240520,
``[1]`` version 1, ``[2]`` number of tokens, rest zero) followed by that many
little-endian uint16 token ids. It is the format of the speedrun's pre-tokenized
FineWeb shards, so those files load unchanged. Token 50256 starts every document.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np

from ..atomic import atomic_file

if TYPE_CHECKING:  # torch is imported on use: tokenizing (and its worker processes) never needs it
    import torch

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_BYTES = 2
_MAX_TOKEN = 2**16 - 1  # uint16


class ShardError(ValueError):
    """A shard file that is not a valid shard; the message names the file and the fix. `offset`
    is the byte offset of the problem in the file, where known."""

    def __init__(self, message: str, offset: int | None = None):
        super().__init__(message)
        self.offset = offset


def _header(n_tokens: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, n_tokens
    return header.tobytes()


def write_shard(path: str | os.PathLike, tokens: Iterable[int] | np.ndarray | torch.Tensor) -> int:
    """Write ``tokens`` as one shard at ``path`` atomically; returns the token count.

    The data goes to a temporary file in the same directory, is fsynced and then renamed
    over ``path``, so a crash never leaves a half-written shard under the final name.
    """
    path = Path(path)
    if hasattr(tokens, "detach"):  # a torch.Tensor
        tokens = tokens.detach().cpu().long().numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"write_shard({path}): tokens must be 1-D, got shape {arr.shape}")
    if arr.dtype != np.uint16:
        if arr.size and (arr.min() < 0 or arr.max() > _MAX_TOKEN):
            raise ValueError(
                f"write_shard({path}): token ids must be in [0, {_MAX_TOKEN}] to fit uint16, "
                f"got range [{arr.min()}, {arr.max()}]; use a vocabulary of at most 65536 tokens"
            )
        arr = arr.astype(np.uint16)
    if arr.size >= 2**31:
        raise ValueError(f"write_shard({path}): {arr.size} tokens exceed the int32 header field; split the shard")
    arr = arr.astype("<u2", copy=False)
    with atomic_file(path) as f:
        f.write(_header(arr.size))
        f.write(arr.tobytes())
    return int(arr.size)


def read_header(path: str | os.PathLike) -> int:
    """Validate the header and the file size of the shard at ``path``; return its token count.

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
    if len(raw) < HEADER_BYTES:
        raise ShardError(
            f"shard {path} is truncated: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header; "
            "delete it and download/tokenize again", offset=len(raw)
        )
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC:
        raise ShardError(
            f"shard {path} has magic {int(header[0])}, expected {MAGIC}: not a token shard "
            "(see docs/format.md); delete it and download/tokenize again", offset=0
        )
    if header[1] != VERSION:
        raise ShardError(
            f"shard {path} has format version {int(header[1])}, this speedgpt reads version {VERSION}; "
            "re-tokenize it with this version", offset=4
        )
    n_tokens = int(header[2])
    expected = HEADER_BYTES + TOKEN_BYTES * n_tokens
    if n_tokens < 0 or size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise ShardError(
            f"shard {path} is {what}: {size} bytes, header says {n_tokens} tokens = {expected} bytes; "
            "delete it and download/tokenize again", offset=min(size, expected)
        )
    return n_tokens


def claimed_tokens(path: str | os.PathLike) -> int:
    """The token count a shard's header claims (0 when the header itself is unreadable), without
    checking the file size: the stream layout of a shard that broke after training started."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError:
        return 0
    if len(raw) < HEADER_BYTES:
        return 0
    header = np.frombuffer(raw, dtype="<i4")
    return int(header[2]) if header[0] == MAGIC and header[1] == VERSION and header[2] > 0 else 0


def load_shard(path: str | os.PathLike, pin_memory: bool = False, *, vocab_size: int | None = None) -> torch.Tensor:
    """The tokens of the shard at ``path`` as a 1-D ``torch.uint16`` tensor.

    Reads straight into the tensor's memory with ``readinto`` (no intermediate copy);
    ``pin_memory=True`` allocates that memory page-locked for fast async host→GPU copies.
    ``vocab_size`` (optional, costs one pass over the data) rejects ids >= vocab_size.
    """
    import torch

    path = Path(path)
    n_tokens = read_header(path)
    tokens = torch.empty(n_tokens, dtype=torch.uint16, pin_memory=pin_memory)
    buf = tokens.numpy()
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        n_read = f.readinto(memoryview(buf).cast("B")) if n_tokens else 0
    if n_read != TOKEN_BYTES * n_tokens:
        raise ShardError(
            f"shard {path}: read {n_read} of {TOKEN_BYTES * n_tokens} token bytes (file changed while reading?); "
            "check the file and load again", offset=HEADER_BYTES + n_read
        )
    if sys.byteorder == "big":  # the format is little-endian on disk
        buf.byteswap(inplace=True)
    if vocab_size is not None and n_tokens:
        top = int(buf.max())
        if top >= vocab_size:
            pos = int(np.argmax(buf >= vocab_size))
            raise ShardError(
                f"shard {path} has token id {top} >= vocab_size {vocab_size} (first at position {pos}); "
                "it was tokenized with another vocabulary: re-tokenize, or raise the model's vocab_size",
                offset=HEADER_BYTES + TOKEN_BYTES * pos,
            )
    return tokens


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
        raise FileNotFoundError(
            f"{where}; create them with `speedgpt data local-python`, `speedgpt data tokenize` "
            "or `speedgpt data fineweb`, or point to the right path"
        )
    return files
