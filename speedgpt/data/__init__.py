"""Data pipeline: shard format (shards), tokenizer, document sources (corpus), tokenization
(tokenize), FineWeb download (fineweb) and the training loader (loader). See docs/data.md.

Import the submodules you need; this package imports nothing, so `import speedgpt.data`
costs nothing and tokenizing never loads torch.
"""
