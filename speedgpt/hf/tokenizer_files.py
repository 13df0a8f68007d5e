"""The tokenizer files of a Hugging Face export (`tokenizer.json` and friends), written offline.

`write_tokenizer_files` writes the run's tokenizer (tokenizer/folder.py's `run_tokenizer`):
- GPT-2's, built from the BPE tables speedgpt ships (speedgpt/data/gpt2_bpe: encoder.json and
  vocab.bpe, the files tiktoken's "gpt2" encoding is made of), plus GPT-2's classic vocab.json and
  merges.txt;
- a tokenizer trained with `speedgpt tokenizer train`: its folder's tokenizer.json (the same byte-level
  BPE, split pattern and separator as its tiktoken ranks).
Either way no download and no `tokenizers` package: `tokenizer.json` is plain JSON in the `tokenizers`
library's format.

The tokenizer puts the separator <|endoftext|> (BOS) before the text, as speedgpt's documents and
prompts start (`AutoTokenizer(...)("text")` gives [BOS, ...], as `speedgpt sample` feeds the model);
`add_special_tokens=False` gives the bare ids.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..data.tokenizer import BOS_ID, GPT2_VOCAB_SIZE
from ..tokenizer.core import SEPARATOR as BOS_TEXT


def _gpt2_tables() -> tuple[dict[str, int], list[str]]:
    """(vocabulary, merges) of GPT-2's byte-level BPE from the bundled files."""
    bpe_dir = resources.files("speedgpt.data") / "gpt2_bpe"
    vocab = json.loads((bpe_dir / "encoder.json").read_text(encoding="utf-8"))
    lines = (bpe_dir / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [line for line in lines[1:] if line]  # the first line is "#version: 0.2"
    return vocab, merges


def _bos_first(bos_id: int) -> dict:
    """The post-processor that puts BOS before each text (a pair: before each of the two), as
    speedgpt's documents start."""
    bos = {"SpecialToken": {"id": BOS_TEXT, "type_id": 0}}
    return {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": BOS_TEXT, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {BOS_TEXT: {"id": BOS_TEXT, "ids": [bos_id], "tokens": [BOS_TEXT]}},
    }


def _gpt2_tokenizer_json(vocab: dict[str, int], merges: list[str]) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": BOS_ID, "content": BOS_TEXT, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": _bos_first(BOS_ID),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def _trained_tokenizer_json(tok) -> dict:
    """A trained tokenizer's tokenizer.json, made again from the ranks and pattern its identity covers (as
    tokenizer/folder.py made the folder's copy: a changed or foreign copy there is not what ships), with the
    BOS-first post-processor."""
    from ..tokenizer.folder import RANKS_FILE, read_ranks, hf_tokenizer_json

    data = json.loads(hf_tokenizer_json(read_ranks(tok.folder / RANKS_FILE), tok.pattern, tok.bos_id))
    return {**data, "post_processor": _bos_first(tok.bos_id)}


def _add_chat_tokens(tokenizer_json: dict, tok) -> dict:
    """The chat template's special tokens (speedgpt/chat/template.py) as added tokens at their ids."""
    from ..chat.template import ChatTemplate

    added = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for name, i in ChatTemplate(tok).specials.items()]
    return {**tokenizer_json, "added_tokens": [*tokenizer_json.get("added_tokens", []), *added]}


def write_tokenizer_files(out_dir: str | Path, tok, *, model_max_length: int, chat: bool = False) -> list[str]:
    """Write the tokenizer `tok` (a speedgpt Tokenizer: GPT-2's or a trained one) into `out_dir`;
    returns the names of the files written. `model_max_length`: the model's context (tools truncate
    inputs to it). `chat` (a model fine-tuned by `speedgpt sft`): the chat tokens too, and the template
    as `chat_template`, so `apply_chat_template` gives the ids speedgpt's template renders."""
    out = Path(out_dir)
    extra: dict[str, str] = {}
    if tok.is_gpt2:
        vocab, merges = _gpt2_tables()
        if len(vocab) != GPT2_VOCAB_SIZE or vocab.get(BOS_TEXT) != BOS_ID:
            raise ValueError(f"the bundled GPT-2 vocabulary has {len(vocab)} entries (expected {GPT2_VOCAB_SIZE} "
                             f"with {BOS_TEXT} = {BOS_ID}); reinstall speedgpt")
        tokenizer_json = _gpt2_tokenizer_json(vocab, merges)
        # GPT-2's classic pair, for tools that read vocab + merges
        extra = {"vocab.json": json.dumps(vocab, ensure_ascii=False) + "\n",
                 "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n"}
    else:
        tokenizer_json = _trained_tokenizer_json(tok)
    # PreTrainedTokenizerFast reads tokenizer.json as written (GPT2Tokenizer would rebuild its own
    # post-processor and drop the BOS template)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS_TEXT,
              "eos_token": BOS_TEXT, "unk_token": BOS_TEXT, "add_prefix_space": False,
              "clean_up_tokenization_spaces": False, "model_max_length": model_max_length}
    if chat:
        from ..chat.template import ChatTemplate

        tokenizer_json = _add_chat_tokens(tokenizer_json, tok)
        config["chat_template"] = ChatTemplate(tok).jinja()
    files = {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": config,
        "special_tokens_map.json": {"bos_token": BOS_TEXT, "eos_token": BOS_TEXT, "unk_token": BOS_TEXT},
    }
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    for name, text in extra.items():
        (out / name).write_text(text, encoding="utf-8")
    return [*files, *extra]
