"""A small multilingual corpus made here (nothing downloaded) and tiny trained tokenizers for the
tokenizer tests."""

from __future__ import annotations

import json
from pathlib import Path

# Sentences in several scripts, code, numbers, whitespace runs and edge cases: every test text must
# survive encode -> decode byte for byte.
SAMPLES = [
    "The quick brown fox jumps over the lazy dog. It's 12:45, we'll see 3.14159 and 1,000,000 ducks.",
    "机器学习是人工智能的一个分支。我们在这里训练一个小模型，然后用它生成中文文本。数据越多，模型越好。",
    "今日は良い天気ですね。トークナイザーを訓練して、小さなモデルで日本語の文章を作ります。",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Модель учится на русском тексте.",
    "مرحبا بالعالم. هذا نص عربي قصير لاختبار الترميز.",
    "Ελληνικά: η γρήγορη καφέ αλεπού. हिन्दी: यह एक छोटा वाक्य है। 한국어 문장도 있습니다.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])\n",
    "emoji 🙂👍🏽 and combining: e\u0301 a\u0308; zero-width\u200bjoiner; tabs\t\tand   spaces   \r\nwindows line\r\n",
    "a literal <|endoftext|> inside a document stays text",
    "中文English混合mixed文本text 123 四五六 ７８９",
    "",
    " ",
    "\n\n\n",
]


def corpus_docs(repeat: int = 30) -> list[str]:
    """Training documents: the samples, varied so that BPE sees repeated pairs to merge."""
    docs = []
    for i in range(repeat):
        for j, s in enumerate(SAMPLES):
            if s.strip():
                docs.append(f"{s} ({i}-{j})\n{SAMPLES[(i + j) % len(SAMPLES)]}")
    return docs


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


def train_small(tmp: Path, vocab_size: int = 512, pattern: str = "nanochat", name: str = "tok"):
    """A tokenizer trained on the multilingual corpus (a fraction of a second)."""
    from speedgpt.tokenizer.train import train_tokenizer

    data = write_jsonl(tmp / f"{name}-corpus.jsonl", corpus_docs())
    return train_tokenizer(data, tmp / name, vocab_size=vocab_size, pattern=pattern, progress=False)
