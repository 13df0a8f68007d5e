"""The default CPU run's corpus in pieces (data.local_piece_chars, corpus.PythonSourceFiles): files cut
at statements into pieces that join back to the file, shuffled the same way on every build, each
file wholly in train or wholly in val. With whole files, a 1,024-token step of the default run was a
ninth of one file and its validation two files: the train curve followed whichever file was
streaming, 5.09 against a val of 3.83."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np

from speedgpt.config import load_preset
from speedgpt.data import corpus
from speedgpt.data.corpus import buffered_shuffle, python_pieces
from speedgpt.data.shards import load_shard
from speedgpt.data.tokenize import ensure_local_python_corpus
from speedgpt.data.tokenizer import BOS_ID, get_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_pieces_join_back_and_cut_at_statements():
    text = (STDLIB / "argparse.py").read_text()
    pieces = list(python_pieces(text, 1500))
    assert "".join(pieces) == text and len(pieces) > 20
    assert max(len(p) for p in pieces) < 4 * 1500 + max(len(line) for line in text.splitlines(keepends=True))
    assert np.median([len(p) for p in pieces]) < 3000
    at_statement = 0
    for before, p in zip(pieces, pieces[1:]):
        first = p.splitlines()[0]
        assert first[:1] not in (")", "]", "}")
        statement = len(first) - len(first.lstrip()) <= 4  # a top-level or method-level statement
        assert statement or not before.splitlines()[-1].strip() or len(before) >= 4 * 1500  # else: fallbacks
        at_statement += statement
    assert at_statement > 0.8 * (len(pieces) - 1)
    decorated = "x = 1\n" * 300 + "@property\ndef f():\n    pass\n"
    assert not any(p.startswith("def f") for p in python_pieces(decorated, 100))  # stays with its decorator


def test_buffered_shuffle_is_a_seeded_permutation_that_mixes():
    items = list(range(5000))
    once = list(buffered_shuffle(items, 256, seed=0))
    assert once == list(buffered_shuffle(items, 256, seed=0)) != list(buffered_shuffle(items, 256, seed=1))
    assert sorted(once) == items
    assert sum(a + 1 == b for a, b in zip(once, once[1:])) < 50  # neighbours are rarely neighbours


def small_stdlib_root(tmp_path: Path, monkeypatch, files: int) -> Path:
    """A folder of `files` mid-sized stdlib modules, made the local corpus's only source root."""
    root = tmp_path / "lib"
    root.mkdir()
    for path in [p for p in sorted(STDLIB.glob("*.py")) if 3000 < p.stat().st_size < 12000][:files]:
        (root / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(corpus, "python_source_roots", lambda: [("stdlib", root)])
    return root


def shard_documents(out: Path, split: str) -> list[str]:
    """The texts of the documents (BOS-separated) in a build's first shard of `split`."""
    tokens = load_shard(out / f"{split}_000000.bin").numpy()
    starts = np.flatnonzero(tokens == BOS_ID)
    return [get_tokenizer().decode(tokens[a + 1:b].tolist()) for a, b in zip(starts, [*starts[1:], len(tokens)])]


def single_owner(root: Path, piece_chars: int) -> dict[str, str]:
    """piece text -> the one file it comes from; a piece that several files share (a licence header) is left
    out: it is kept once, on either side of the split, and says nothing about a file's side."""
    owners: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        for piece in python_pieces(path.read_text(), piece_chars):
            owners.setdefault(piece, set()).add(path.name)
    return {piece: next(iter(names)) for piece, names in owners.items() if len(names) == 1}


def test_piece_corpus_keeps_each_file_in_one_split(tmp_path, monkeypatch):
    root = small_stdlib_root(tmp_path, monkeypatch, 50)
    m = ensure_local_python_corpus(tmp_path / "out", None, piece_chars=800, val_fraction=0.2, workers=1,
                                   progress=False)
    assert m["params"]["sources"][0]["documents"].startswith("pieces of ~800 chars, split by file")
    owner = single_owner(root, 800)

    def files_in(split: str) -> list[str]:  # every document is a piece of a file
        return [owner[d] for d in shard_documents(tmp_path / "out", split) if d in owner]

    train, val = files_in("train"), files_in("val")
    assert val and not set(train) & set(val)
    assert len(set(val)) >= 5 and len(train) > 2 * len(set(train))  # whole files in val, pieces in train
    runs = sum(a != b for a, b in zip(train, train[1:]))
    assert runs > 0.8 * len(train)  # shuffled: consecutive documents come from different files


def test_a_small_piece_corpus_validates_on_one_whole_file(tmp_path, monkeypatch):
    """No file's hash below val_fraction (a small build): the file of the smallest hash is val, every piece of it
    (they share the split key and wait together), and train keeps every piece of the others."""
    root = small_stdlib_root(tmp_path, monkeypatch, 6)
    m = ensure_local_python_corpus(tmp_path / "out", None, piece_chars=800, val_fraction=1e-12, workers=1,
                                   progress=False)
    owner = single_owner(root, 800)

    def files_in(split: str) -> list[str]:
        return [owner[d] for d in shard_documents(tmp_path / "out", split) if d in owner]

    train, val = files_in("train"), files_in("val")
    assert len(set(val)) == 1 and len(val) > 1 and not set(train) & set(val), (set(val), len(val))
    assert len(val) == sum(p in owner for p in python_pieces((root / val[0]).read_text(), 800))  # all its pieces
    assert m["val"]["documents"] == len(shard_documents(tmp_path / "out", "val")) and m["params"]["ensure_val"]


def test_pieces_and_whole_files_split_the_files_alike(tmp_path, monkeypatch):
    # A corpus of pieces is set against the whole-file corpus of the same machine on the latter's val files
    # (`--data.val_files`): no file may be val in one build and train in the other.
    root = small_stdlib_root(tmp_path, monkeypatch, 40)
    for piece_chars in (0, 800):
        ensure_local_python_corpus(tmp_path / f"out{piece_chars}", None, piece_chars=piece_chars, val_fraction=0.25,
                                   workers=1, progress=False)
    by_text = {p.read_text(): p.name for p in root.glob("*.py")}
    val_files = {by_text[d] for d in shard_documents(tmp_path / "out0", "val")}
    train_files = {by_text[d] for d in shard_documents(tmp_path / "out0", "train")}
    assert len(val_files) >= 4 and train_files and not val_files & train_files
    owner = single_owner(root, 800)
    for split, files in (("val", val_files), ("train", train_files)):
        pieces = shard_documents(tmp_path / "out800", split)
        assert pieces and {owner[p] for p in pieces if p in owner} <= files


def test_the_cpu_preset_trains_on_pieces():
    data = load_preset("tiny-cpu").data
    assert data.local_piece_chars > 0 and data.default_corpus_dir().name.endswith(f"-pieces{data.local_piece_chars}")
