"""Split patterns: the regex that cuts text into pieces before BPE. A token never crosses a piece
boundary, so the pattern decides what a token can be (a word with its leading space, up to two
digits, a run of punctuation, ...).

The patterns use the syntax that tiktoken, rustbpe (both fancy-regex) and Hugging Face tokenizers
(Oniguruma) all read the same way (possessive quantifiers, \\p{..} classes, \\x{....}); a test
checks that the three cut text identically.
"""

from __future__ import annotations

# GPT-4's pattern (cl100k) as nanochat uses it: numbers in pieces of at most two digits instead of
# three, which spends fewer of a small vocabulary's tokens on numbers.
NANOCHAT = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
            r"""|\s*[\r\n]|\s+(?!\S)|\s+""")

# Chinese and Japanese put no spaces between words, so under NANOCHAT a whole clause, or an
# unpunctuated paragraph, is one piece. BPE training cannot merge repeated pieces of such text,
# and tiktoken's encoding time grows faster than linearly with a piece's length (measured: 1.1 MB/s
# on a 100K-character piece against 3.4 MB/s on ordinary text). CJK keeps NANOCHAT's pieces except
# that a run of Han/Hiragana/Katakana characters (and the prolonged-sound mark U+30FC) is cut into
# pieces of at most 32 characters. On Chinese and Japanese text the compression is the same as
# NANOCHAT's (docs/tokenizer.md); isolating those runs from a leading space or punctuation, or
# cutting them shorter (4 to 16), measured worse.
_CJK_CHARS = r"\p{Han}\p{Hiragana}\p{Katakana}\x{30FC}"
CJK = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+(?:[""" + _CJK_CHARS + r"""]{1,32}|[^\P{L}""" + _CJK_CHARS
       + r"""]+)|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")

PATTERNS = {"nanochat": NANOCHAT, "cjk": CJK}
DEFAULT_PATTERN = "nanochat"
