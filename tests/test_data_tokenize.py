"""Tokenizer, corpus sources, tokenize_corpus and the local Python corpus (real GPT-2 BPE)."""

import gzip
import json

import numpy as np
import pytest

from speedgpt.data import tokenize as tok
from speedgpt.data import tokenize_pool
from speedgpt.data.corpus import MISSING_FIELD, Documents, JsonlFiles, ParquetFiles, TextFiles, python_source_files
from speedgpt.data.shards import find_shards, load_shard
from speedgpt.data.tokenize import ensure_local_python_corpus, tokenize_corpus, tokenize_files
from speedgpt.data.tokenizer import BOS_ID, GPT2_VOCAB_SIZE, encode_document, get_tokenizer

TEXTS = [
    "Hello world",
    "def f(x):\n    return x * 2\n",
    "a literal <|endoftext|> stays text",
    "ünïcödé — 日本語 🙂 and \t tabs\r\n",
    "x" * 5000,
]


def docs_of(files):
    """Split the concatenated shards back into documents (lists of ids without BOS)."""
    if not files:
        return []
    data = np.concatenate([load_shard(f).numpy() for f in files]).astype(np.int64)
    starts = np.flatnonzero(data == BOS_ID)
    assert len(data) == 0 or starts[0] == 0
    return [data[a + 1 : b].tolist() for a, b in zip(starts, list(starts[1:]) + [len(data)])]


def test_tokenizer_is_gpt2():
    enc = get_tokenizer()
    assert enc is get_tokenizer()  # cached
    assert BOS_ID == 50256 and GPT2_VOCAB_SIZE == enc.n_vocab == 50257
    assert enc.encode_ordinary("Hello world") == [15496, 995]  # the published GPT-2 ids
    assert encode_document("Hello world") == [50256, 15496, 995]
    doc = encode_document("<|endoftext|>")
    assert doc[0] == BOS_ID and BOS_ID not in doc[1:]  # a document cannot fake a boundary
    assert enc.decode(doc[1:]) == "<|endoftext|>"


def test_worker_encoding_equals_encode_ordinary():
    tokens, lengths, hashes = tokenize_pool.encode_chunk(TEXTS)
    expected = [encode_document(t) for t in TEXTS]
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [t for e in expected for t in e]
    assert hashes == [tokenize_pool.doc_hash(t) for t in TEXTS] and len(set(hashes)) == len(TEXTS)


def many_docs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "def", "return", "(", ")", "\n", "  ", "42", "ü"]
    return [f"doc {i}: " + " ".join(rng.choice(words, size=int(rng.integers(1, 200)))) for i in range(n)]


def test_round_trip_split_and_shards(tmp_path):
    texts = many_docs()
    texts.insert(100, "long " * 3000)  # longer than a shard: kept whole, in a shard of its own
    m = tokenize_corpus(Documents(texts), tmp_path, val_fraction=0.1, shard_tokens=2000, workers=1, progress=False)
    train, val = find_shards(tmp_path, "train"), find_shards(tmp_path, "val")
    assert [f.name for f in train] == [f"train_{i:06d}.bin" for i in range(len(train))]
    assert m["train"]["shards"][0]["file"] == "train_000000.bin" and len(train) == len(m["train"]["shards"]) > 5
    for f, info in zip(train, m["train"]["shards"]):
        tokens = load_shard(f).numpy()
        assert tokens[0] == BOS_ID  # shards hold whole documents
        assert len(tokens) == info["tokens"] and (len(tokens) <= 2000 or (tokens == BOS_ID).sum() == 1)
    enc = get_tokenizer()
    train_docs, val_docs = docs_of(train), docs_of(val)
    # Train + val partition the input documents, each in input order, none lost or changed.
    threshold = int(0.1 * 2**64)
    assert [enc.decode(d) for d in train_docs] == [t for t in texts if tokenize_pool.doc_hash(t) >= threshold]
    assert [enc.decode(d) for d in val_docs] == [t for t in texts if tokenize_pool.doc_hash(t) < threshold]
    assert 20 <= len(val_docs) <= 70  # ~10% of 401
    assert m["documents"] == len(texts) and m["tokens"] == m["train"]["tokens"] + m["val"]["tokens"]
    assert m["train"]["documents"] == len(train_docs) and m["val"]["documents"] == len(val_docs)
    assert json.loads((tmp_path / "manifest.json").read_text()) == m


def test_deterministic_across_worker_counts(tmp_path):
    texts = many_docs(600, seed=1)
    kw = dict(val_fraction=0.05, shard_tokens=5000, progress=False)
    m1 = tokenize_corpus(Documents(texts), tmp_path / "w1", workers=1, **kw)
    m2 = tokenize_corpus(Documents(texts), tmp_path / "w2", workers=2, **kw)
    files1 = sorted(p.name for p in (tmp_path / "w1").glob("*.bin"))
    assert files1 == sorted(p.name for p in (tmp_path / "w2").glob("*.bin")) and len(files1) > 3
    for name in files1:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()
    m1.pop("build"), m2.pop("build")
    assert m1 == m2


def test_split_is_stable_under_corpus_changes(tmp_path):
    texts = many_docs(300, seed=2)
    m = tokenize_corpus(Documents(texts), tmp_path / "a", val_fraction=0.2, workers=1, progress=False)
    changed = list(reversed(texts)) + many_docs(50, seed=3) + [texts[0]]  # reordered, grown, a duplicate
    tokenize_corpus(Documents(changed), tmp_path / "b", val_fraction=0.2, workers=1, progress=False)
    enc = get_tokenizer()
    val_a = {enc.decode(d) for d in docs_of(find_shards(tmp_path / "a", "val"))}
    val_b = [enc.decode(d) for d in docs_of(find_shards(tmp_path / "b", "val"))]
    assert val_a == {t for t in val_b if t in set(texts)}  # old documents keep their split
    assert val_b.count(texts[0]) in (0, 1)  # the duplicate is dropped: never on both sides of the split
    assert m["val"]["documents"] == len(val_a)


def test_val_docs_takes_smallest_hashes(tmp_path):
    texts = many_docs(200, seed=4)
    m = tokenize_corpus(Documents(texts), tmp_path, val_docs=7, workers=1, progress=False)
    enc = get_tokenizer()
    val = [enc.decode(d) for d in docs_of(find_shards(tmp_path, "val"))]
    smallest = sorted(texts, key=tokenize_pool.doc_hash)[:7]
    assert val == [t for t in texts if t in smallest]  # exactly those 7, in input order
    train = [enc.decode(d) for d in docs_of(find_shards(tmp_path, "train"))]
    assert sorted(train) == sorted(t for t in texts if t not in smallest)
    assert m["val"]["documents"] == 7 and m["sources"][0]["val_documents"] == 7


def test_max_tokens_stops_after_whole_document(tmp_path):
    texts = many_docs(300, seed=5)
    m = tokenize_corpus(Documents(texts), tmp_path, val_fraction=0.0, max_tokens=3000, workers=2, progress=False)
    assert m["stopped_early"] and "max_tokens=3,000" in m["note"]
    assert 3000 <= m["tokens"] < 3000 + max(len(encode_document(t)) for t in texts)
    enc = get_tokenizer()
    out = [enc.decode(d) for d in docs_of(find_shards(tmp_path, "train"))]
    assert out == texts[: len(out)]  # a prefix of whole documents
    assert not list(tmp_path.glob("val_*.bin"))


def test_rerun_replaces_old_outputs(tmp_path):
    tokenize_corpus(Documents(many_docs(300)), tmp_path, shard_tokens=1000, workers=1, progress=False)
    n_before = len(list(tmp_path.glob("train_*.bin")))
    tokenize_corpus(Documents(many_docs(10)), tmp_path, shard_tokens=1000, workers=1, progress=False)
    assert len(list(tmp_path.glob("train_*.bin"))) < n_before  # no stale shards left behind


@pytest.mark.parametrize("failure", ["no documents", "one document", "interrupted"])
def test_a_failed_build_leaves_the_folders_earlier_data_as_it_was(tmp_path, monkeypatch, failure):
    """A build that fails (nothing usable read, no val split possible, stopped mid-way) must not cost the data its
    --out folder already holds: the old shards, manifest and tokenizer copy stay, byte for byte, and no partial
    build is left beside them."""
    tokenize_corpus(Documents(many_docs(300)), tmp_path, shard_tokens=1000, workers=1, progress=False)
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    if failure == "interrupted":
        def stop(*args, **kwargs):
            raise KeyboardInterrupt
        monkeypatch.setattr(tok.Splitter, "add", stop)
    docs = {"no documents": [], "one document": ["only one"], "interrupted": many_docs(10)}[failure]
    with pytest.raises((tokenize_pool.TokenizeError, KeyboardInterrupt)):
        tokenize_corpus(Documents(docs), tmp_path, shard_tokens=1000, workers=1, progress=False, ensure_val=True)
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before


def test_a_bad_jsonl_line_is_skipped_alone(tmp_path):
    """A line that is not UTF-8 costs that line only: the whole file was read as text and every line after it was
    lost, counted as one skipped item. A truncated .jsonl.gz keeps what it held and names the file."""
    lines = [json.dumps({"text": f"document {i}"}).encode() for i in range(1000)]
    lines[899] = '{"text": "caf\xe9"}'.encode("latin-1")
    (tmp_path / "late.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    src = JsonlFiles(tmp_path / "late.jsonl")
    docs = [text for _, text in src.documents()]
    assert len(docs) == 999 and docs[-1] == "document 999" and src.skipped.counts == {"not UTF-8": 1}
    assert src.skipped.examples["not UTF-8"] == [f"{tmp_path / 'late.jsonl'}:900"]
    whole = gzip.compress(b"\n".join(lines[:100]) + b"\n")
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[:len(whole) // 2])
    src = JsonlFiles(tmp_path / "cut.jsonl.gz")
    docs = [text for _, text in src.documents()]
    assert 0 < len(docs) < 100 and docs == [f"document {i}" for i in range(len(docs))]
    (reason,) = src.skipped.counts
    assert reason == "unreadable (EOFError)" and "cut.jsonl.gz (read up to line" in src.skipped.examples[reason][0]


def test_a_json_array_file_is_read_as_records(tmp_path):
    """A pretty-printed .json array was read line by line: every line invalid JSON, or the hint to change
    --text-field. Its records are read now, as JSON lines are; a .json of JSON lines still works."""
    records = [{"text": f"document {i}"} for i in range(3)] + [{"body": "no text field"}]
    (tmp_path / "pretty.json").write_text(json.dumps(records, indent=2))
    src = JsonlFiles(tmp_path / "pretty.json")
    assert [t for _, t in src.documents()] == ["document 0", "document 1", "document 2"]
    assert src.skipped.examples[f"{MISSING_FIELD} 'text'"] == [f"{tmp_path / 'pretty.json'}[3] with fields: body"]
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in records[:2]) + "\n")
    assert [t for _, t in JsonlFiles(tmp_path / "lines.json").documents()] == ["document 0", "document 1"]


def test_text_files_jsonl_parquet_sources(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "b.txt").write_text("second file")
    (tmp_path / "txt" / "a.txt").write_text("first file")
    (tmp_path / "txt" / "bad.txt").write_bytes(b"\xff\xfe not utf-8 \xc3")
    (tmp_path / "txt" / "empty.txt").write_text("")
    lines = [json.dumps({"text": "j1"}), "not json", json.dumps({"body": "x"}), "", json.dumps({"text": "j2"})]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    with gzip.open(tmp_path / "e.jsonl.gz", "wt") as f:
        f.write(json.dumps({"content": "g1"}) + "\n")
    table = pa.table({"text": ["p1", None, "p2", "p3"], "id": [1, 2, 3, 4]})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=2)  # two row groups

    src = TextFiles(tmp_path / "txt")
    assert [t for _, t in src.documents()] == ["first file", "second file"]
    assert src.skipped.counts == {"not UTF-8": 1, "empty document": 1}
    jsonl = JsonlFiles(tmp_path / "d.jsonl")
    assert [t for _, t in jsonl.documents()] == ["j1", "j2"]
    assert jsonl.skipped.counts == {"invalid JSON": 1, "no string field 'text'": 1}
    assert jsonl.skipped.examples["invalid JSON"] == [f"{tmp_path / 'd.jsonl'}:2"]
    assert [t for _, t in JsonlFiles(tmp_path / "e.jsonl.gz", text_field="content").documents()] == ["g1"]
    parquet = ParquetFiles(tmp_path / "f.parquet", batch_rows=1)
    assert [t for _, t in parquet.documents()] == ["p1", "p2", "p3"]
    assert parquet.skipped.counts == {"null text": 1}
    with pytest.raises(ValueError, match="has no column 'body'"):
        list(ParquetFiles(tmp_path / "f.parquet", text_column="body").documents())
    with pytest.raises(FileNotFoundError, match="nothing"):
        TextFiles(tmp_path / "nothing*")

    m = tokenize_files([tmp_path / "txt", tmp_path / "d.jsonl", tmp_path / "f.parquet"], tmp_path / "out",
                       val_fraction=0.0, workers=1, progress=False)
    enc = get_tokenizer()
    assert [enc.decode(d) for d in docs_of(find_shards(tmp_path / "out", "train"))] == [
        "first file", "second file", "j1", "j2", "p1", "p2", "p3"]
    assert [s["kind"] for s in m["sources"]] == ["text", "jsonl", "parquet"]
    assert m["sources"][0]["skipped"]["not UTF-8"]["count"] == 1 and m["sources"][0]["skipped_total"] == 2
    assert m["sources"][1]["skipped_total"] == 2 and m["sources"][2]["skipped"] == {"null text": {"count": 1, "examples": [f"{tmp_path / 'f.parquet'}:1"]}}


def test_ensure_local_corpus_builds_reuses_rebuilds(tmp_path, monkeypatch):
    corpus = tmp_path / "src"
    corpus.mkdir()
    for i, t in enumerate(many_docs(100, seed=6)):
        (corpus / f"m{i:03d}.py").write_text(t)
    monkeypatch.setattr(tok, "python_source_files", lambda piece_chars=0: TextFiles(corpus, suffixes=(".py",)))
    out = tmp_path / "data"
    m = ensure_local_python_corpus(out, 2000, workers=1, progress=False)
    assert m["stopped_early"] and m["tokens"] >= 2000
    shard = out / "train_000000.bin"
    stamp = shard.stat().st_mtime_ns
    assert ensure_local_python_corpus(out, 2000, workers=1, progress=False) == m
    assert shard.stat().st_mtime_ns == stamp  # reused, not rebuilt
    m3 = ensure_local_python_corpus(out, 4000, workers=1, progress=False)  # other parameters: rebuilt
    assert m3["params"]["max_tokens"] == 4000 and m3["tokens"] >= 4000
    shard.unlink()  # damaged output: rebuilt
    ensure_local_python_corpus(out, 4000, workers=1, progress=False)
    assert shard.is_file()


def test_python_source_corpus_is_real_and_ordered(tmp_path):
    src = python_source_files()
    ids = [doc_id for doc_id, _ in src.files]
    assert ids[0].startswith("stdlib/") and "stdlib/json/__init__.py" in ids
    order = [doc_id.split("/", 1)[0] for doc_id in ids]
    assert order == sorted(order, key=["stdlib", "site-packages", "site-packages-plat"].index)
    assert len(ids) == len(set(ids)) and src.describe()["files"] == len(ids)
    m = ensure_local_python_corpus(tmp_path, 50_000, workers=1, progress=False)
    assert m["sources"][0]["kind"] == "python-source" and 50_000 <= m["tokens"]
    assert load_shard(tmp_path / "train_000000.bin", vocab_size=GPT2_VOCAB_SIZE)[0] == BOS_ID


def test_progress_bar_reports_rate_on_stderr(tmp_path, capsys):
    tokenize_corpus(Documents(many_docs(50)), tmp_path, workers=1, progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "tok/s" in captured.err and "50 docs" in captured.err
