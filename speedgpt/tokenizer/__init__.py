"""Byte-level BPE tokenizers: GPT-2's (bundled) and your own, trained on your text.

- patterns.py   the split patterns (regexes that cut text into pieces before BPE)
- core.py       `Tokenizer`: one object for GPT-2 and trained tokenizers (tiktoken encodes)
- folder.py     a tokenizer's folder (tokenizer.json, tokenizer.tiktoken, speedgpt_tokenizer.json):
                writing, loading, and the tokenizer of a run or export (`run_tokenizer`)
- train.py      `speedgpt tokenizer train` (rustbpe's trainer)
- compression.py bytes per token against GPT-2 (`speedgpt tokenizer eval`, the run report)
- shards.py     which tokenizer made a set of shards (their headers), and its folder
- cli.py        `speedgpt tokenizer train | eval`

Nothing here is imported by `import speedgpt`; tiktoken, rustbpe and tokenizers load on use.
"""
