"""`speedgpt tokenizer train | eval`: training, the folder format, exact round trips, agreement of
tiktoken / tokenizer.json / rustbpe, and the commands' one-line errors."""

from __future__ import annotations

import json

import pytest

from speedgpt.cli import main
from speedgpt.tokenizer.core import SEPARATOR
from speedgpt.tokenizer.folder import TokenizerError, load_folder, read_meta
from speedgpt.tokenizer.patterns import PATTERNS
from tokkit import SAMPLES, corpus_docs, train_small, write_jsonl


@pytest.fixture(scope="module", params=list(PATTERNS))
def tok(request, tmp_path_factory):
    return train_small(tmp_path_factory.mktemp(request.param), pattern=request.param)


def test_round_trip_is_exact_on_every_text(tok):
    assert tok.vocab_size == 512 and tok.bos_id == 511  # the separator is the last id
    again = load_folder(tok.folder)
    assert again.sha256 == tok.sha256
    for text in SAMPLES:
        ids = tok.encode(text)
        assert tok.decode_bytes(ids) == text.encode("utf-8")  # bytes in, the same bytes out
        assert tok.decode(ids) == text
        assert all(i < tok.bos_id for i in ids)  # text never encodes to the separator, not even "<|endoftext|>"
        assert tok.encode_document(text) == [tok.bos_id, *ids]
        assert again.encode(text) == ids
    assert tok.encode_batch(SAMPLES) == [tok.encode(t) for t in SAMPLES]


def test_trained_tokenizer_compresses_its_text(tok):
    from speedgpt.tokenizer.core import gpt2_tokenizer

    text = "\n".join(corpus_docs(2))
    assert len(text.encode()) / len(tok.encode(text)) > 1.5  # bytes alone would be 1.0
    for sample in (SAMPLES[1], SAMPLES[3]):  # Chinese and Russian: even 255 merges beat GPT-2's 50K
        assert len(tok.encode(sample)) < len(gpt2_tokenizer().encode(sample))


def test_tokenizer_json_and_rustbpe_encode_alike(tok):
    """speedgpt encodes with tiktoken; tokenizer.json (transformers, the HF export) and rustbpe (the
    trainer) must give the same ids. The one stated difference: Hugging Face splits a literal
    "<|endoftext|>" out as the special token, where speedgpt keeps it text."""
    import rustbpe
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(tok.tokenizer_json))
    assert hf.get_vocab_size() == tok.vocab_size and hf.token_to_id(SEPARATOR) == tok.bos_id
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(corpus_docs()), tok.vocab_size - 1, pattern=tok.pattern)
    assert {bytes(t): r for t, r in trainer.get_mergeable_ranks()} == tok.encoding._mergeable_ranks
    for text in SAMPLES:
        ids = tok.encode(text)
        assert trainer.encode(text) == ids
        if SEPARATOR in text:
            assert tok.bos_id in hf.encode(text, add_special_tokens=False).ids
            continue
        assert hf.encode(text, add_special_tokens=False).ids == ids, text
        assert hf.decode(ids) == text


def test_invalid_utf8_is_stated(tok, tmp_path):
    # Decoding ids whose bytes cut a character: exact bytes, U+FFFD in text.
    first = tok.encoding.encode_single_token("中".encode()[:1])
    assert tok.decode_bytes([first]) == b"\xe4"
    assert tok.decode([first]) == "\ufffd"
    # A lone surrogate (no UTF-8 text holds one) is encoded as U+FFFD.
    assert tok.decode(tok.encode("a\ud800b")) == "a\ufffdb"
    # Input bytes that are not UTF-8 are not text: such a file is skipped and counted.
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "good.txt").write_text("plain text " * 50)
    (tmp_path / "in" / "bad.txt").write_bytes(b"caf\xe9 latin-1 " * 50)
    from speedgpt.tokenizer.train import train_tokenizer

    t2 = train_tokenizer(tmp_path / "in", tmp_path / "t2", vocab_size=300, progress=False)
    skipped = read_meta(t2.folder)["training"]["sources"][0]["skipped"]
    assert skipped["not UTF-8"]["count"] == 1
    assert read_meta(t2.folder)["training"]["documents"] == 1


def test_max_chars_caps_what_is_read(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", corpus_docs())
    from speedgpt.tokenizer.train import train_tokenizer

    t = train_tokenizer(data, tmp_path / "t", vocab_size=300, max_chars=1000, progress=False)
    tr = read_meta(t.folder)["training"]
    assert tr["chars"] == 1000 and tr["stopped_early"] and tr["documents"] <= 10


def test_a_changed_folder_is_refused(tok, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tok.folder, copy)
    lines = (copy / "tokenizer.tiktoken").read_bytes().splitlines()
    a, b = lines[300].split(), lines[301].split()
    lines[300], lines[301] = a[0] + b" " + b[1], b[0] + b" " + a[1]  # two merges swapped
    (copy / "tokenizer.tiktoken").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TokenizerError, match="do not match its recorded identity"):
        load_folder(copy)


def test_cli_train_and_eval(tmp_path, capsys):
    data = write_jsonl(tmp_path / "zh.jsonl", corpus_docs())
    (tmp_path / "code.py").write_text(SAMPLES[6] * 20)
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", str(data), "--vocab-size", "400", "--out", str(out), "--name", "multi"]) == 0
    assert "trained multi (vocab 400" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["speedgpt_tokenizer.json", "tokenizer.json", "tokenizer.tiktoken"]
    assert json.loads((out / "speedgpt_tokenizer.json").read_text())["pattern_name"] == "nanochat"
    # An existing tokenizer is replaced only when asked.
    assert main(["tokenizer", "train", str(data), "--vocab-size", "400", "--out", str(out)]) == 2
    assert "already holds a tokenizer; pass --overwrite" in capsys.readouterr().err
    assert main(["tokenizer", "train", str(data), "--vocab-size", "300", "--out", str(out), "--overwrite",
                 "--pattern", "cjk"]) == 0
    assert load_folder(out).vocab_size == 300
    capsys.readouterr()
    assert main(["tokenizer", "eval", str(out), str(data), str(tmp_path / "code.py")]) == 0
    table = capsys.readouterr().out
    assert "bytes/token" in table and "gpt2" in table and "code.py" in table


@pytest.mark.parametrize("argv, message", [
    (["train", "{tmp}/missing.txt", "--vocab-size", "400", "--out", "{tmp}/t"], "no files found for"),
    (["train", "{data}", "--vocab-size", "100", "--out", "{tmp}/t"], "--vocab-size 100: must be in [257"),
    (["train", "{data}", "--vocab-size", "400", "--out", "{data}"], "is a file"),
    (["train", "{data}", "--vocab-size", "400", "--out", "{tmp}/other"], "is not empty and holds no tokenizer"),
    (["train", "{data}", "--vocab-size", "400", "--out", "{tmp}/t", "--max-chars", "0"], "--max-chars 0"),
    (["train", "{tmp}/empty.txt", "--vocab-size", "400", "--out", "{tmp}/t"], "no text read from the inputs"),
    (["eval", "{tmp}/nothing", "{data}"], "tokenizer folder"),
    (["eval", "{tmp}/other", "{data}"], "is not a tokenizer folder"),
    (["eval", "gpt2", "{tmp}/missing.txt"], "no files found for"),
    (["eval", "gpt2", "{data}", "--text-field", "body"], "(skipped: no string field 'body'); check the inputs or "
                                                          "--text-field (now 'body')"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, argv, message):
    data = write_jsonl(tmp_path / "d.jsonl", corpus_docs(2))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a tokenizer")
    (tmp_path / "empty.txt").write_text("")
    argv = [a.format(tmp=tmp_path, data=data) for a in argv]
    assert main(["tokenizer", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"speedgpt tokenizer {argv[0]}: error:") and message in err[0], err
    assert not (tmp_path / "t").exists()


def test_a_text_too_small_for_the_vocabulary_says_so(tmp_path, capsys):
    (tmp_path / "tiny.txt").write_text("abab abab")
    assert main(["tokenizer", "train", str(tmp_path / "tiny.txt"), "--vocab-size", "1000", "--out",
                 str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    tok = load_folder(tmp_path / "t")
    assert tok.vocab_size < 1000 and f"the vocabulary is {tok.vocab_size:,}" in out
    assert tok.decode(tok.encode("abab abab")) == "abab abab"


def test_gpt2_identity_constant_is_its_ranks_hash():
    """Shard headers compare against GPT2_SHA256 without loading GPT-2's ranks: it must be their hash."""
    from speedgpt.tokenizer.core import GPT2_SHA256, gpt2_tokenizer, identity_sha256

    enc = gpt2_tokenizer().encoding
    assert identity_sha256(enc._mergeable_ranks, enc._pat_str, enc._special_tokens) == GPT2_SHA256
    assert gpt2_tokenizer().bos_id == 50256 and gpt2_tokenizer().vocab_size == 50257


def test_max_chars_takes_the_form_the_help_shows(tmp_path, capsys):
    """The help says "default 1e9"; `--max-chars 1e6` was refused as an invalid int."""
    data = write_jsonl(tmp_path / "d.jsonl", corpus_docs(2))
    assert main(["tokenizer", "train", str(data), "--vocab-size", "300", "--max-chars", "1e6",
                 "--out", str(tmp_path / "t")]) == 0
    assert read_meta(tmp_path / "t")["training"]["max_chars"] == 1_000_000
    capsys.readouterr()
    assert main(["tokenizer", "eval", str(tmp_path / "t"), str(data), "--max-chars", "10K"]) == 0


def test_eval_says_what_it_skipped_in_an_input_it_measured(tmp_path, capsys):
    """An input with some unreadable records (a JSONL line without the text field, a line cut short) was
    measured over the rest without a word: `tokenizer train` reported its skips, eval dropped them."""
    docs = corpus_docs(4)
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs) + '{"body": "x"}\n{"text": "cut')
    assert main(["tokenizer", "eval", "gpt2", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"note: {path}: skipped 2 unreadable items (invalid JSON; no string field 'text'); its row measures " \
           f"the {len(docs)} documents read" in out, out
