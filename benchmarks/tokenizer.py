"""Your own tokenizer: training time and compression against GPT-2's, trainer choice, encoding throughput.

    python benchmarks/tokenizer.py [--train-chars 100000000] [--vocab 32768] [--lang zh_CN] [--hf] [--json out.json]

1. The local Python-source corpus (this interpreter's .py files): a --vocab tokenizer trained on the
   first --train-chars characters with rustbpe (speedgpt's trainer) and, with --hf, Hugging Face
   tokenizers' BpeTrainer on the same text and pattern; bytes per token of both and of GPT-2 on the
   next 10M characters (held out).
2. A non-English text: the --lang gettext catalogs of this machine (scripts/locale_text.py), every
   10th catalog held out; the nanochat and cjk patterns; a --vocab and an 8K tokenizer.
3. `tokenize_corpus` (what `data tokenize` runs) over 40M characters of the Python corpus with GPT-2
   and with the trained tokenizer, 1 and 2 workers: MB of text per second and tokens per second.
4. tiktoken's encoding speed on 100K Han characters without punctuation (one piece under nanochat's
   pattern), nanochat against cjk.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from speedgpt.data.corpus import Documents, python_source_files  # noqa: E402
from speedgpt.data.tokenize import tokenize_corpus  # noqa: E402
from speedgpt.tokenizer.compression import measure  # noqa: E402
from speedgpt.tokenizer.folder import read_meta  # noqa: E402
from speedgpt.tokenizer.patterns import PATTERNS  # noqa: E402
from speedgpt.tokenizer.train import train_tokenizer  # noqa: E402


def python_texts(chars: int, skip: int = 0) -> list[str]:
    """Documents of the local Python corpus after the first `skip` characters, `chars` in all."""
    out, seen, got = [], 0, 0
    for _, text in python_source_files().documents():
        if seen < skip:
            seen += len(text)
            continue
        out.append(text)
        got += len(text)
        if got >= chars:
            break
    return out


def bytes_per_token(tok, texts) -> tuple[float, float]:
    m = measure(tok, texts)
    return m["bytes"] / m["tokens"], m["bytes"] / m["ref_tokens"]


def train(texts, vocab, pattern, tmp, name):
    tok = train_tokenizer(Documents(texts, name=name), Path(tmp) / name, vocab_size=vocab, pattern=pattern,
                          progress=False)
    return tok, read_meta(tok.folder)["training"]["seconds"]


def train_hf(texts, vocab, pattern) -> tuple[object, float]:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - 1, show_progress=False, min_frequency=0,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.perf_counter()
    hf.train_from_iterator(texts, trainer)
    return hf, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-chars", type=int, default=100_000_000)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--lang", default="zh_CN")
    p.add_argument("--hf", action="store_true", help="also train with Hugging Face tokenizers (slower)")
    p.add_argument("--encode-chars", type=int, default=40_000_000)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    res: dict = {}
    tmp = tempfile.mkdtemp(prefix="speedgpt-tokbench-")

    # 1. local Python sources
    train_texts = python_texts(args.train_chars)
    held = python_texts(10_000_000, skip=sum(map(len, train_texts)))
    tok, secs = train(train_texts, args.vocab, "nanochat", tmp, "py")
    ours, gpt2 = bytes_per_token(tok, held)
    res["python"] = {"train_chars": sum(map(len, train_texts)), "vocab": tok.vocab_size, "rustbpe_s": secs,
                     "bytes_per_token": ours, "gpt2_bytes_per_token": gpt2}
    print(f"python: {res['python']['train_chars'] / 1e6:.1f}M chars, {tok.vocab_size} vocab, rustbpe {secs:.1f}s; "
          f"held-out bytes/token {ours:.3f} (GPT-2 {gpt2:.3f})", flush=True)
    if args.hf:
        hf, hf_s = train_hf(train_texts, args.vocab, PATTERNS["nanochat"])
        nb = sum(len(t.encode()) for t in held)
        hf_bpt = nb / sum(len(e.ids) for e in hf.encode_batch(held, add_special_tokens=False))
        res["python"].update(hf_s=hf_s, hf_bytes_per_token=hf_bpt)
        print(f"python: HF tokenizers BpeTrainer {hf_s:.1f}s; held-out bytes/token {hf_bpt:.3f}", flush=True)

    # 2. non-English
    from locale_text import catalog_texts

    docs = [d["text"] for d in catalog_texts(args.lang)]
    held_l = docs[::10]
    train_l = [d for i, d in enumerate(docs) if i % 10]
    res["lang"] = {"lang": args.lang, "train_chars": sum(map(len, train_l)), "held_chars": sum(map(len, held_l))}
    for pattern in ("nanochat", "cjk"):
        for vocab in (8192, args.vocab):
            t, s = train(train_l, vocab, pattern, tmp, f"{args.lang}-{pattern}-{vocab}")
            o, g = bytes_per_token(t, held_l)
            res["lang"][f"{pattern}_{vocab}"] = {"vocab": t.vocab_size, "seconds": s, "bytes_per_token": o,
                                                 "gpt2_bytes_per_token": g}
            print(f"{args.lang} {pattern} {vocab}: vocab {t.vocab_size}, {s:.1f}s; held-out bytes/token {o:.3f} "
                  f"(GPT-2 {g:.3f})", flush=True)

    # 3. encoding throughput through the data pipeline, GPT-2 against the trained tokenizer, interleaved
    texts = python_texts(args.encode_chars)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    runs: dict[str, list] = {}
    for _ in range(2):
        for workers in (1, 2):
            for name, which in (("gpt2", None), ("ours", tok)):
                with tempfile.TemporaryDirectory() as out:
                    t0 = time.perf_counter()
                    m = tokenize_corpus(Documents(texts), out, workers=workers, progress=False, tokenizer=which)
                    s = time.perf_counter() - t0
                runs.setdefault(f"{name}_{workers}", []).append((mb / s, m["tokens"] / s))
    res["encode"] = {"mb": mb}
    for key, vals in runs.items():
        mbs, tps = statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)
        res["encode"][key] = {"mb_per_s": mbs, "tokens_per_s": tps, "all": vals}
        print(f"tokenize_corpus {key}: {mbs:.2f} MB/s, {tps / 1e6:.2f}M tok/s (median of {len(vals)})", flush=True)

    # 4. one long unpunctuated piece of Han characters
    han = "".join(c for c in "".join(docs) if "\u4e00" <= c <= "\u9fff")[:100_000]
    if han:
        for pattern in ("nanochat", "cjk"):
            t = train_tokenizer(Documents(train_l), Path(tmp) / f"long-{pattern}", vocab_size=8192, pattern=pattern,
                                progress=False)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                t.encode(han)
                times.append(time.perf_counter() - t0)
            speed = len(han.encode()) / min(times) / 1e6
            res.setdefault("long_han", {})[pattern] = speed
            print(f"100K Han chars, no punctuation, {pattern}: {speed:.2f} MB/s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
