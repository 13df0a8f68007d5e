"""Which tokenizer made a set of shards: the stamp their headers record (GPT-2's where they record
none), the same for every file or an error naming two that differ, and the tokenizer's folder.

`data tokenize --tokenizer DIR` copies the tokenizer next to its shards (OUT/tokenizer/), so data and
tokenizer travel together; a folder given explicitly (data.tokenizer) must have the shards' identity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..data.shards import TokenizerStamp, claimed_info
from .core import GPT2_SHA256, Tokenizer, gpt2_tokenizer, id64
from .folder import RUN_SUBDIR, TokenizerError, load_folder

GPT2_STAMP = TokenizerStamp(50257, 50256, id64(GPT2_SHA256))


def stamp_of(tok: Tokenizer) -> TokenizerStamp:
    """What shard headers record of `tok`."""
    return TokenizerStamp(tok.vocab_size, tok.bos_id, tok.id64)


def describe_stamp(stamp: TokenizerStamp) -> str:
    return "gpt2 (vocab 50257)" if stamp == GPT2_STAMP else f"tokenizer {stamp.short_id} (vocab {stamp.vocab_size})"


def shards_stamp(files: Sequence[Path]) -> TokenizerStamp:
    """The one tokenizer of `files`; a ValueError naming a file of each when two tokenizers made them.
    Only headers are read: a file whose header is unreadable is left to the loader, which reports or
    skips it (data.on_bad_shard)."""
    first: dict[TokenizerStamp, Path] = {}
    for f in files:
        info = claimed_info(f)
        if info is None:
            continue
        stamp = info.stamp or GPT2_STAMP
        first.setdefault(stamp, f)
        if len(first) > 1:
            (a, fa), (b, fb) = first.items()
            raise ValueError(f"the shards come from two tokenizers: {fa} from {describe_stamp(a)}, {fb} from "
                             f"{describe_stamp(b)}; tokenize all the data with one tokenizer")
    if not first:
        return GPT2_STAMP  # no readable header: the data setup reports the files
    return next(iter(first))


def shards_tokenizer(files: Sequence[Path], folder: str | Path | None = None) -> Tokenizer:
    """The tokenizer that made `files`: GPT-2's, or the one in `folder` (default: tokenizer/ next to the
    first file; "gpt2": GPT-2's), which must be the one their headers record."""
    stamp = shards_stamp(files)
    where = Path(folder) if folder and folder != "gpt2" else Path(files[0]).parent / RUN_SUBDIR
    if folder == "gpt2" or (stamp == GPT2_STAMP and not folder):
        tok = gpt2_tokenizer()
    elif not folder and not where.is_dir():
        raise TokenizerError(f"the shards in {Path(files[0]).parent} were made by {describe_stamp(stamp)}, but no "
                             f"tokenizer folder is next to them ({where}); pass its folder as --data.tokenizer=DIR")
    else:
        tok = load_folder(where)
    if stamp_of(tok) != stamp:
        raise TokenizerError(f"tokenizer {tok.folder or 'gpt2'} is {tok.describe()}, but the shards in "
                             f"{Path(files[0]).parent} were made by {describe_stamp(stamp)}; pass the folder of "
                             f"the tokenizer that made them")
    return tok
