"""Split patterns: the regex that cuts text into pieces before BPE. A token never crosses a piece
boundary, so the pattern decides what a token can be (a word with its leading space, up to two
digits, a run of punctuation, ...).

The patterns use the syntax that tiktoken, rustbpe (both fancy-regex) and Hugging Face tokenizers
(Oniguruma) all read the same way (possessive quantifiers, \\p{..} classes, \\x{....}); a test
checks that the three encode multilingual text, code and whitespace runs to the same ids.
"""

from __future__ import annotations

# GPT-4's pattern (cl100k) as nanochat uses it: numbers in pieces of at most two digits instead of
# three, which spends fewer of a small vocabulary's tokens on numbers.
NANOCHAT = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
            r"""|\s*[\r\n]|\s+(?!\S)|\s+""")

# Chinese and Japanese put no spaces between words, so under NANOCHAT a whole clause, or an
# unpunctuated paragraph, is one piece. BPE training counts each distinct piece once with its
# frequency, which long unique pieces defeat, and tiktoken's time per byte grows with a piece's length
# (100K Han characters without punctuation: 1.26 MB/s as one piece, 2.46 MB/s cut at 32). CJK keeps
# NANOCHAT's pieces except that a run of Han/Hiragana/Katakana characters (and the prolonged-sound mark
# U+30FC) is cut into pieces of at most 32 characters. On Chinese and Japanese text it compresses as
# NANOCHAT does (docs/tokenizer.md); isolating those runs from a leading space or punctuation, or
# cutting them shorter (4 to 16), measured worse.
_CJK_CHARS = r"\p{Han}\p{Hiragana}\p{Katakana}\x{30FC}"
CJK = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+(?:[""" + _CJK_CHARS + r"""]{1,32}|[^\P{L}""" + _CJK_CHARS
       + r"""]+)|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")

PATTERNS = {"nanochat": NANOCHAT, "cjk": CJK}
DEFAULT_PATTERN = "nanochat"
