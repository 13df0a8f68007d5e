"""No document twice (issue 32 item 5): `data tokenize` keeps one copy of each exact text, over
chunks, worker processes and shards, counts the rest in the manifest and its summary, and no val
document equals a train document, also where split keys (pieces of files) would part two copies."""

from __future__ import annotations

import numpy as np

from speedgpt.cli import main
from speedgpt.data import tokenize_pool
from speedgpt.data.corpus import Documents, doc_hash
from speedgpt.data.dedupe import SeenHashes
from speedgpt.data.shards import find_shards, load_shard
from speedgpt.data.tokenize import read_manifest, tokenize_corpus
from speedgpt.data.tokenizer import BOS_ID, get_tokenizer


def texts_of(out, split: str) -> list[str]:
    enc, texts = get_tokenizer(), []
    for f in find_shards(out, split) if list(out.glob(f"{split}_*.bin")) else []:
        tokens = load_shard(f).numpy()
        starts = np.flatnonzero(tokens == BOS_ID)
        texts += [enc.decode(tokens[a + 1:b].tolist()) for a, b in zip(starts, [*starts[1:], len(tokens)])]
    return texts


def test_seen_hashes_keeps_the_first_of_each_value_like_a_set():
    rng, seen, ref = np.random.default_rng(0), SeenHashes(), set()
    batches = []
    for i in range(300):
        h = rng.integers(0, 2**64 - 1, 64, dtype=np.uint64)
        if batches:  # repeats of earlier batches and within this one
            h[:20] = rng.choice(np.concatenate(batches), 20)
        h[30:35] = h[40:45]
        batches.append(h)
        expected = []
        for x in h.tolist():
            expected.append(x not in ref)
            ref.add(x)
        assert seen.first_seen(h).tolist() == expected
    assert len(seen) == len(ref)


def test_duplicated_files_keep_one_copy_and_val_never_holds_a_train_document(tmp_path, monkeypatch, capsys):
    # copies meet across chunks (the parent keeps the hashes, so worker processes do not matter)
    monkeypatch.setattr(tokenize_pool, "CHUNK_DOCS", 7)
    rng = np.random.default_rng(0)
    words = ["def", "return", "x", "(", ")", "\n", "import", "os", "self", "42"]
    unique = [f"# module {i}\n" + " ".join(rng.choice(words, size=int(rng.integers(5, 80)))) for i in range(60)]
    src = tmp_path / "site-packages"
    for i, text in enumerate(unique):
        (src / "pkg").mkdir(parents=True, exist_ok=True)
        (src / "pkg" / f"m{i}.py").write_text(text)
        for copy in range(i % 3):  # vendored copies: 0, 1 or 2 more of each file
            (src / f"vendor{copy}" / "pkg").mkdir(parents=True, exist_ok=True)
            (src / f"vendor{copy}" / "pkg" / f"m{i}.py").write_text(text)
    copies = sum(i % 3 for i in range(60))
    dup_tokens = sum(len(get_tokenizer().encode_ordinary(t)) + 1 for i, t in enumerate(unique) for _ in range(i % 3))
    out = tmp_path / "out"
    rc = main(["data", "tokenize", str(src), "--out", str(out), "--val-fraction", "0.3", "--shard-tokens", "300",
               "--workers", "1"])
    assert rc == 0
    train, val = texts_of(out, "train"), texts_of(out, "val")
    assert sorted(train + val) == sorted(unique)  # every text once, none lost
    assert val and not set(val) & set(train)
    m = read_manifest(out)
    assert m["duplicates"] == {"documents": copies, "tokens": dup_tokens} and m["documents"] == 60
    assert m["sources"][0]["duplicate_documents"] == copies and m["params"]["dedupe"] == "exact"
    assert len(m["train"]["shards"]) > 3  # copies met across shards too
    assert f"dropped {copies} duplicate documents ({dup_tokens:,} tokens)" in capsys.readouterr().out
    assert main(["data", "tokenize", str(src), "--out", str(out), "--val-fraction", "0.3", "--keep-duplicates",
                 "--workers", "1"]) == 0
    assert len(texts_of(out, "train") + texts_of(out, "val")) == 60 + copies
    assert read_manifest(out)["duplicates"]["documents"] == 0


class FilePieces(Documents):
    """Documents whose split follows their file (the doc id before '#'), as the local corpus's pieces."""

    def split_key(self, doc_id: str) -> int:
        return doc_hash(doc_id.split("#")[0])


def test_a_piece_two_files_share_lands_on_one_side_only(tmp_path):
    header = "# Licensed under the Apache License, Version 2.0\n"
    docs = [(f"file{i}#{k}", header if k == 0 else f"body {k} of file {i}\n") for i in range(40) for k in range(2)]
    tokenize_corpus(FilePieces(docs), tmp_path / "kept", val_fraction=0.3, workers=1, progress=False,
                    dedupe=False)
    train, val = texts_of(tmp_path / "kept", "train"), texts_of(tmp_path / "kept", "val")
    assert header in train and header in val  # without dedupe the shared piece straddles the split
    m = tokenize_corpus(FilePieces(docs), tmp_path / "out", val_fraction=0.3, workers=1, progress=False)
    train, val = texts_of(tmp_path / "out", "train"), texts_of(tmp_path / "out", "val")
    assert (train + val).count(header) == 1 and not set(train) & set(val)
    assert m["duplicates"]["documents"] == 39 and m["documents"] == 41
