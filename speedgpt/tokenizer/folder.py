"""A tokenizer's folder, as `speedgpt tokenizer train` writes it and every command reads it:

    DIR/
      tokenizer.json           Hugging Face `tokenizers` format (byte-level BPE, the split pattern,
                               the separator as a special token): loads in `tokenizers` and transformers
      tokenizer.tiktoken       tiktoken's rank file ("base64(token bytes) rank" per line): what speedgpt
                               encodes with
      speedgpt_tokenizer.json  name, split pattern, separator id, vocabulary size, identity (sha256)
                               and how it was trained

The identity is recomputed from the files on every load and must match the recorded one, so a folder
whose files were changed after training is refused rather than silently encoding differently.

A run keeps its tokenizer as RUN_DIR/tokenizer/ (and an export as EXPORT/tokenizer/); a run or
export without one used GPT-2 (`run_tokenizer`).
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from ..rundir import TOKENIZER_DIR
from .core import FORMAT, HF_FILE, SEPARATOR, Tokenizer, gpt2_tokenizer, identity_sha256

RANKS_FILE = "tokenizer.tiktoken"
META_FILE = "speedgpt_tokenizer.json"
FILES = (HF_FILE, RANKS_FILE, META_FILE)
RUN_SUBDIR = TOKENIZER_DIR  # inside a run, an export or a tokenized data directory


class TokenizerError(ValueError):
    """A tokenizer folder is missing, incomplete or inconsistent; the message says what to do."""


def is_tokenizer_folder(path: str | Path) -> bool:
    return (Path(path) / META_FILE).is_file()


# ----------------------------------------------------------------------------- writing


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (printable Latin-1 bytes as
    themselves, the others shifted past 255), the form `tokenizer.json` stores byte tokens in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two tokens whose merge made `token`: BPE over its bytes with only the ranks below its own
    stops at exactly two parts (the last merge is the token's)."""
    limit = ranks[token]
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best = min(((ranks.get(parts[i] + parts[i + 1], limit), i) for i in range(len(parts) - 1)))
        if best[0] >= limit:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise TokenizerError(f"token {token!r} (rank {limit}) is not a merge of two lower-ranked tokens: "
                             f"the ranks are not a BPE merge order")
    return parts[0], parts[1]


def hf_tokenizer_json(ranks: dict[bytes, int], pattern: str, separator_id: int) -> str:
    """The same tokenizer in Hugging Face `tokenizers`' JSON: vocabulary and merges from the ranks,
    the split pattern then byte-level mapping as pre-tokenizer, the separator as a special token."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    to_char = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_char[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [tuple(map(text, _merge_of(token, ranks)))
              for token, _ in sorted(ranks.items(), key=lambda item: item[1]) if len(token) > 1]
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(SEPARATOR, special=True, normalized=False)])
    if hf.token_to_id(SEPARATOR) != separator_id:
        raise TokenizerError(f"tokenizer.json gave {SEPARATOR} id {hf.token_to_id(SEPARATOR)}, expected {separator_id}")
    return hf.to_str(pretty=False)


def write_folder(out: str | Path, ranks: dict[bytes, int], pattern: str, *, name: str, pattern_name: str,
                 training: dict | None = None) -> Tokenizer:
    """Write the three files of a tokenizer (ranks + pattern; the separator gets the next id) into
    `out`, atomically (a crash leaves the old folder or the new one, never a mix). Returns it loaded."""
    from ..atomic import atomic_dir

    separator_id = len(ranks)
    if sorted(ranks.values()) != list(range(separator_id)):
        raise TokenizerError("BPE ranks must be exactly 0..N-1")
    specials = {SEPARATOR: separator_id}
    meta = {"format": FORMAT, "name": name, "pattern_name": pattern_name, "pattern": pattern,
            "special_tokens": specials, "bos_id": separator_id, "vocab_size": separator_id + 1,
            "sha256": identity_sha256(ranks, pattern, specials), "training": training or {}}
    lines = b"".join(base64.b64encode(token) + b" %d\n" % rank
                     for token, rank in sorted(ranks.items(), key=lambda item: item[1]))
    hf_json = hf_tokenizer_json(ranks, pattern, separator_id)
    with atomic_dir(out) as tmp:
        (tmp / RANKS_FILE).write_bytes(lines)
        (tmp / HF_FILE).write_text(hf_json, encoding="utf-8")
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return load_folder(out)


def copy_folder(tok: Tokenizer, dest: str | Path) -> Path | None:
    """Copy a trained tokenizer's files into `dest` (atomically; GPT-2: nothing to copy, None)."""
    from ..atomic import atomic_dir

    if tok.folder is None:
        return None
    dest = Path(dest)
    if dest.resolve() == tok.folder.resolve():
        return dest
    with atomic_dir(dest) as tmp:
        for name in FILES:
            shutil.copyfile(tok.folder / name, tmp / name)
    return dest


# ----------------------------------------------------------------------------- reading


def read_ranks(path: Path) -> dict[bytes, int]:
    # Parsed here, not with tiktoken.load.load_tiktoken_bpe: that caches files by path under /tmp, so a
    # tokenizer trained again into the same folder would load the old ranks.
    ranks = {}
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:
            raise TokenizerError(f"{path} line {n} is not 'base64 rank': the file is damaged; train the "
                                 f"tokenizer again or copy the folder anew") from None
    return ranks


def load_folder(folder: str | Path) -> Tokenizer:
    """The tokenizer in `folder` (written by `speedgpt tokenizer train`); TokenizerError if not one."""
    import tiktoken

    folder = Path(folder).expanduser()
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file"
        raise TokenizerError(f"tokenizer folder {folder} {what}; pass the --out folder of `speedgpt tokenizer train`")
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise TokenizerError(f"{folder} is not a tokenizer folder (no {', '.join(missing)}); pass the --out "
                             f"folder of `speedgpt tokenizer train`")
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            raise ValueError
        pattern, specials, recorded = meta["pattern"], meta["special_tokens"], meta["sha256"]
    except (ValueError, KeyError, TypeError):
        raise TokenizerError(f"{folder / META_FILE} is not a {FORMAT} file; train the tokenizer again") from None
    ranks = read_ranks(folder / RANKS_FILE)
    sha = identity_sha256(ranks, pattern, specials)
    if sha != recorded:
        raise TokenizerError(f"tokenizer folder {folder}: its files do not match its recorded identity (changed "
                             f"after training?); train it again or copy the original folder")
    enc = tiktoken.Encoding(name=f"speedgpt-{sha[:16]}", pat_str=pattern, mergeable_ranks=ranks,
                            special_tokens=specials)
    return Tokenizer(str(meta.get("name") or folder.name), enc, pattern, sha, folder)


def read_meta(folder: str | Path) -> dict:
    """speedgpt_tokenizer.json of a tokenizer folder (name, pattern, training summary), unverified."""
    return json.loads((Path(folder) / META_FILE).read_text(encoding="utf-8"))


def load_tokenizer(spec: str | Path | None) -> Tokenizer:
    """A folder's tokenizer, or GPT-2's for None / "" / "gpt2"."""
    if spec in (None, "", "gpt2"):
        return gpt2_tokenizer()
    return load_folder(spec)


def run_tokenizer(run_or_export: str | Path, cfg=None) -> Tokenizer:
    """The tokenizer of a run or export directory: its tokenizer/ folder, or GPT-2 for one without
    (every run before custom tokenizers). Checked against the model's config (`cfg`, read from the
    directory when not given): the same BOS id, and a trained tokenizer has no id past the model's
    vocabulary (a GPT-2 run may have trained on smaller synthetic ids)."""
    root = Path(run_or_export).expanduser()
    sub = root / RUN_SUBDIR
    tok = load_folder(sub) if sub.is_dir() else gpt2_tokenizer()
    if cfg is None:
        from ..rundir import RunDir
        from ..rundir.weights import load_config, locate

        run = RunDir(root)
        cfg = run.read_config() if run.is_run() else load_config(locate(root))
    m = cfg.model
    if tok.bos_id != m.bos_id or (tok.folder is not None and tok.vocab_size > m.vocab_size):
        where = f"{sub}" if sub.is_dir() else "GPT-2 (no tokenizer/ folder)"
        raise TokenizerError(f"{root}: its tokenizer {where} (vocab {tok.vocab_size}, BOS {tok.bos_id}) does not "
                             f"fit its model (model.vocab_size {m.vocab_size}, model.bos_id {m.bos_id}); restore "
                             f"the run's tokenizer/ folder")
    return tok
