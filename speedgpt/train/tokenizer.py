"""The run's tokenizer: the one that made its shards. Its vocabulary size and BOS id become the
model's (in the config the run saves), shards of two tokenizers are refused, and a trained tokenizer
is kept in the run (RUN_DIR/tokenizer/) so evaluation, sampling and export use it, with its
compression on the validation text logged for the report."""

from __future__ import annotations

import dataclasses

from ..config import Config, ConfigError, RunConfig
from ..tokenizer.core import Tokenizer, gpt2_tokenizer


def adopt_shards_tokenizer(cfg: Config) -> tuple[Config, Tokenizer | None, list[str]]:
    """(config, tokenizer, lines to print). A trained tokenizer sets model.vocab_size, model.bos_id
    and data.tokenizer (its folder). GPT-2's (shards that record none, or the default corpus) leaves
    the config as it is: a run may pad GPT-2's vocabulary, and synthetic test shards carry small ids.
    Missing shards are left to the data setup to report (the tokenizer is None then: GPT-2)."""
    from ..data.shards import find_shards
    from ..tokenizer.shards import shards_tokenizer

    d = cfg.data
    if not d.train_files:  # the default local corpus: GPT-2
        if d.tokenizer:
            raise ConfigError(f"data.tokenizer={d.tokenizer} names the tokenizer of data.train_files, which is empty "
                              f"(the default corpus is GPT-2's); pass --data.train_files=DIR of its shards")
        return cfg, None, []
    try:
        files = find_shards(d.train_files, "train") + find_shards(d.val_files or d.train_files, "val")
    except FileNotFoundError:
        return cfg, None, []
    tok = shards_tokenizer(files, d.tokenizer or None)
    if tok.is_gpt2:
        return cfg, tok, []
    m = cfg.model
    lines = [f"tokenizer: {tok.describe()} from {tok.folder}"]
    if (m.vocab_size, m.bos_id) != (tok.vocab_size, tok.bos_id):
        lines[0] += (f"; model.vocab_size={tok.vocab_size} and model.bos_id={tok.bos_id} from the shards "
                     f"(were {m.vocab_size}, {m.bos_id})")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(m, vocab_size=tok.vocab_size, bos_id=tok.bos_id),
                              data=dataclasses.replace(d, tokenizer=str(tok.folder)))
    return cfg, tok, lines


def check_same_tokenizer(tok: Tokenizer | None, run_root) -> None:
    """ConfigError when a resume's training shards carry another tokenizer than the run's own copy (RUN/tokenizer/,
    or GPT-2's for a run without one): its ids would mean other text. Said before the model's vocabulary size is
    (the error a resume of re-tokenized data gave)."""
    from ..tokenizer.folder import RUN_SUBDIR, is_tokenizer_folder, load_folder

    if tok is None:  # the default corpus, or shards not found (the data setup says so)
        return
    own = run_root / RUN_SUBDIR
    mine = load_folder(own).sha256 if is_tokenizer_folder(own) else None  # None: GPT-2's
    theirs = None if tok.is_gpt2 else tok.sha256
    if mine != theirs:
        shards = f"{tok.describe()}" if theirs else "GPT-2's"
        run = f"its own ({own})" if mine else "GPT-2's"
        raise ConfigError(f"the training shards carry {shards} tokenizer, but {run_root} was trained with {run}; "
                          f"resume it on shards made with that tokenizer (data tokenize --tokenizer), or start a "
                          f"new run")


def keep_in_run(tok: Tokenizer | None, run_root) -> None:
    """Copy a trained tokenizer into the run directory (GPT-2 runs keep none: they read as GPT-2)."""
    from ..tokenizer.folder import RUN_SUBDIR, copy_folder

    if tok is not None and not tok.is_gpt2:
        copy_folder(tok, run_root / RUN_SUBDIR)


def log_compression(tok: Tokenizer | None, val_files, val_tokens: int, metrics) -> None:
    """An "event": "tokenizer" record: bytes per token of the validation text under the run's
    tokenizer and under GPT-2's (the report shows it). Only for trained tokenizers."""
    import numpy as np

    from ..data.shards import load_shard
    from ..tokenizer.compression import measure_tokens, ratio

    if tok is None or tok.is_gpt2:
        return
    parts, n = [], 0
    for f in val_files:
        if n >= val_tokens:
            break
        part = load_shard(f).numpy()[:val_tokens - n]
        parts.append(part)
        n += len(part)
    m = measure_tokens(tok, np.concatenate(parts), reference=gpt2_tokenizer())
    metrics.log({"step": 0, "tokens": 0, "time_s": 0.0, "event": "tokenizer", "tokenizer": tok.name,
                 "tokenizer_id": tok.short_id, "vocab_size": tok.vocab_size, "tokenizer_documents": m["documents"],
                 "tokenizer_bytes": m["bytes"], "bytes_per_token": ratio(m["bytes"], m["tokens"]),
                 "gpt2_bytes_per_token": ratio(m["bytes"], m["ref_tokens"])})


def check_sample_prompt(cfg: Config, tok: Tokenizer | None) -> None:
    """run.sample_prompt, the start of the sample `speedgpt train` prints after training, must fit the model's
    context: refused before the first step, not found once the whole run has trained. `tok`: the run's tokenizer
    (None: GPT-2's, as adopt_shards_tokenizer gives it)."""
    from ..model.runtime import max_seq_len

    if not cfg.run.sample_tokens:
        return
    tokens, context = len((tok or gpt2_tokenizer()).encode_document(cfg.run.sample_prompt)), max_seq_len(cfg)
    if tokens >= context:  # as infer/generate.py decode_steps refuses it: room for one new token at least
        raise ConfigError(f"run.sample_prompt is {tokens} tokens (with BOS), which does not fit the model's context "
                          f"of {context}; shorten it, or give --run.sample_tokens=0 for no sample")
    # decode_steps never samples past the context (its KV cache and the rotary tables stop there), so more new
    # tokens than the context holds can never come: a slip (1e9 for 1e2) that was accepted, cut there in silence,
    # and on a long-context preset (val rows of 262,144) cost that many decode steps and a KV cache to match once the
    # run had trained. Up to the context is allowed, and up to the default's length whatever the context (a run of
    # short rows that never named the key was refused for it; its sample is cut at the context, as `sample` cuts).
    if cfg.run.sample_tokens > max(context, RunConfig().sample_tokens):
        raise ConfigError(f"run.sample_tokens={cfg.run.sample_tokens} is more than the model's context of {context} "
                          f"tokens, where a sample stops; give at most {context - tokens} (the context less the "
                          f"prompt's {tokens} tokens with BOS), or 0 for no sample")
