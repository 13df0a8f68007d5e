"""`Tokenizer`: the one object every command uses to turn text into token ids and back, for GPT-2's
bundled BPE and for tokenizers trained with `speedgpt tokenizer train` alike.

Encoding goes through tiktoken (an `Encoding` built from the BPE ranks and the split pattern), the
fast path `data tokenize` has always used. The separator `<|endoftext|>` is the last id and starts
every document (BOS); text is encoded as ordinary text, so a literal "<|endoftext|>" in a document
stays text and can never make a false document boundary.

Round trip: `decode_bytes(encode(text)) == text.encode()` for every str made of Unicode scalar values
(the text of a UTF-8 file, JSONL or Parquet string). Lone surrogates ("\\ud800"), which no UTF-8 text
can hold, are encoded as U+FFFD, as tiktoken does. Going the other way, any id sequence has exact
bytes (`decode_bytes`); `decode` turns bytes that are not valid UTF-8 (a sequence cut inside a
character, e.g. a sample stopped mid-way) into U+FFFD.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import tiktoken

SEPARATOR = "<|endoftext|>"
FORMAT = "speedgpt.tokenizer/1"
HF_FILE = "tokenizer.json"  # a trained tokenizer's Hugging Face file in its folder (folder.py writes it)
# GPT-2's identity (`identity_sha256` of its bundled ranks, pattern and separator); a test recomputes it.
# Kept as a constant so that reading shard headers never needs GPT-2's rank table.
GPT2_SHA256 = "c11f693789f6a40bae093fd0644ef69be61bd956e163151c7ca2c8b77b80a4f1"
UINT16_VOCAB = 2**16  # ids 0..65535 fit a uint16 shard; a larger vocabulary needs 32-bit shards


def identity_sha256(ranks: dict[bytes, int], pattern: str, special_tokens: dict[str, int]) -> str:
    """The hex sha256 of what decides every encoding: the split pattern, the special tokens and the
    BPE ranks (in the tiktoken rank-file form). Two tokenizers with the same identity encode alike."""
    h = hashlib.sha256()
    h.update(f"{FORMAT}\n{pattern}\n{json.dumps(sorted(special_tokens.items()))}\n".encode())
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        h.update(base64.b64encode(token) + b" %d\n" % rank)
    return h.hexdigest()


def id64(sha256_hex: str) -> int:
    """The 64-bit form of an identity that shard headers record (its first 8 bytes, little-endian)."""
    return int.from_bytes(bytes.fromhex(sha256_hex)[:8], "little")


@dataclass(frozen=True, eq=False)
class Tokenizer:
    """A byte-level BPE tokenizer with its document separator.

    `encoding` is the tiktoken `Encoding`; functions written for tiktoken (bits-per-byte's byte
    lengths, HellaSwag, CORE, streaming) take it as it is. `folder` is where its files are (None for
    GPT-2, whose files ship inside speedgpt).
    """

    name: str
    encoding: tiktoken.Encoding
    pattern: str
    sha256: str
    folder: Path | None = None

    @property
    def bos_id(self) -> int:
        return self.encoding.encode_single_token(SEPARATOR)

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    @property
    def id64(self) -> int:
        return id64(self.sha256)

    @property
    def short_id(self) -> str:
        """16 hex digits: the part of the identity that shard headers carry."""
        return self.sha256[:16]

    @property
    def is_gpt2(self) -> bool:
        return self.sha256 == GPT2_SHA256

    @property
    def token_dtype(self) -> np.dtype:
        """The narrowest unsigned integer that holds every id (what the shards store)."""
        return np.dtype(np.uint16 if self.vocab_size <= UINT16_VOCAB else np.uint32)

    @property
    def tokenizer_json(self) -> Path | None:
        """Its Hugging Face `tokenizer.json` (None for GPT-2: its files ship in tiktoken's form)."""
        return self.folder / HF_FILE if self.folder is not None else None

    def describe(self) -> str:
        """'gpt2 (vocab 50257)' or 'zh8k (vocab 8192, id 1a2b3c4d5e6f7a8b)'."""
        return "gpt2 (vocab 50257)" if self.is_gpt2 else f"{self.name} (vocab {self.vocab_size}, id {self.short_id})"

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS); special-token text stays ordinary text."""
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(list(texts))

    def encode_to_numpy(self, text: str) -> np.ndarray:
        # With no special token allowed or checked this is encode_ordinary, returning a buffer instead
        # of a list of Python ints (saves ~15% of a tokenization's time).
        return self.encoding.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def encode_document(self, text: str) -> list[int]:
        """BOS + the text's ids: how every document starts in the shards (and a prompt in sampling)."""
        return [self.bos_id, *self.encode(text)]

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.encoding.decode_bytes(list(ids))

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


@functools.cache
def gpt2_tokenizer() -> Tokenizer:
    """GPT-2's BPE from the files bundled in speedgpt/data/gpt2_bpe (no download)."""
    from ..data.tokenizer import get_tokenizer

    enc = get_tokenizer()
    return Tokenizer("gpt2", enc, enc._pat_str, GPT2_SHA256)
