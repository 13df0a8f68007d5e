"""The GPT-2 BPE tokenizer, loaded from the files bundled in ``speedgpt/data/gpt2_bpe``.

tiktoken's ``get_encoding("gpt2")`` downloads its files on first use; a training
machine may have no internet, so we build the same ``Encoding`` from local copies.
"""

from __future__ import annotations

import functools
from importlib import resources

BOS_ID = 50256  # <|endoftext|>; the speedrun prepends it to every document and uses it as BOS
GPT2_VOCAB_SIZE = 50257


@functools.cache
def get_tokenizer():
    """The GPT-2 ``tiktoken.Encoding`` (cached: building the rank table takes ~0.5 s)."""
    # Imported here so that importing speedgpt.data costs nothing.
    import tiktoken
    import tiktoken.load
    from tiktoken_ext.openai_public import r50k_pat_str

    bpe_dir = resources.files("speedgpt.data") / "gpt2_bpe"
    # as_file gives a real filesystem path even if the package is zipped.
    with resources.as_file(bpe_dir / "vocab.bpe") as vocab_bpe, resources.as_file(
        bpe_dir / "encoder.json"
    ) as encoder_json:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json)
        )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": BOS_ID},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def encode_document(text: str) -> list[int]:
    """Token ids of one document with BOS prepended.

    ``encode_ordinary`` treats a literal "<|endoftext|>" in the text as plain text, so a
    document can never inject a fake document boundary.
    """
    return [BOS_ID, *get_tokenizer().encode_ordinary(text)]
