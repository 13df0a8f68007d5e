"""The tokenizer files of a Hugging Face export (`tokenizer.json` and friends), written offline.

One function, `write_tokenizer_files`, so that other tokenizers can plug in beside GPT-2's. GPT-2's
files are built from the BPE tables speedgpt ships (speedgpt/data/gpt2_bpe: encoder.json and
vocab.bpe, the files tiktoken's "gpt2" encoding is made of), so the export needs no download and no
`tokenizers` package: `tokenizer.json` is plain JSON in the `tokenizers` library's format.

The tokenizer puts <|endoftext|> (BOS) before the text, as speedgpt's documents and prompts start
(`AutoTokenizer(...)("text")` gives [50256, ...], as `speedgpt sample` feeds the model);
`add_special_tokens=False` gives the bare ids.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..data.tokenizer import BOS_ID, GPT2_VOCAB_SIZE

BOS_TEXT = "<|endoftext|>"
TOKENIZER_SOURCES = ("gpt2",)


def _gpt2_tables() -> tuple[dict[str, int], list[str]]:
    """(vocabulary, merges) of GPT-2's byte-level BPE from the bundled files."""
    bpe_dir = resources.files("speedgpt.data") / "gpt2_bpe"
    vocab = json.loads((bpe_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (bpe_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [line for line in lines[1:] if line]  # the first line is "#version: 0.2"
    return vocab, merges


def _tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict:
    bos = {"SpecialToken": {"id": BOS_TEXT, "type_id": 0}}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": BOS_ID, "content": BOS_TEXT, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        # BOS before each text (a pair: before each of the two), as speedgpt's documents start
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS_TEXT, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS_TEXT: {"id": BOS_TEXT, "ids": [BOS_ID], "tokens": [BOS_TEXT]}},
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def write_tokenizer_files(out_dir: str | Path, tokenizer_source: str = "gpt2", *, model_max_length: int) -> list[str]:
    """Write the tokenizer of `tokenizer_source` into `out_dir`; returns the names of the files written.
    `model_max_length`: the model's context (tools truncate inputs to it)."""
    if tokenizer_source not in TOKENIZER_SOURCES:
        raise ValueError(f"tokenizer '{tokenizer_source}' has no Hugging Face writer; available: "
                         f"{', '.join(TOKENIZER_SOURCES)}")
    out = Path(out_dir)
    vocab, merges = _gpt2_tables()
    if len(vocab) != GPT2_VOCAB_SIZE or vocab.get(BOS_TEXT) != BOS_ID:
        raise ValueError(f"the bundled GPT-2 vocabulary has {len(vocab)} entries (expected {GPT2_VOCAB_SIZE} with "
                         f"{BOS_TEXT} = {BOS_ID}); reinstall speedgpt")
    files = {
        "tokenizer.json": _tokenizer_json(vocab, merges),
        # PreTrainedTokenizerFast reads tokenizer.json as written (GPT2Tokenizer would rebuild its own
        # post-processor and drop the BOS template)
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TEXT,
                                  "eos_token": BOS_TEXT, "unk_token": BOS_TEXT, "add_prefix_space": False,
                                  "clean_up_tokenization_spaces": False, "model_max_length": model_max_length},
        "special_tokens_map.json": {"bos_token": BOS_TEXT, "eos_token": BOS_TEXT, "unk_token": BOS_TEXT},
        "vocab.json": vocab,  # GPT-2's classic pair, for tools that read vocab + merges
    }
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    return [*files, "merges.txt"]
