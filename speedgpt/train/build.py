"""What the trainer builds from its config before the first step: the data files (and a check that
they hold every stage's batches), the training loader, the parallel strategy, and the model under
that strategy; plus the lines that say what was built and which switches fall back on this device."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import Config, ConfigError
from ..model.build import model_from_config
from ..model.gpt import GPT
from ..parallel.dist import DistInfo, barrier
from ..plan import RunPlan


def resolve_data_files(cfg: Config, dist_info: DistInfo, log) -> tuple[list[Path], list[Path]]:
    from ..data.shards import find_shards, given_shards

    d = cfg.data
    given = given_shards(d)
    if given is not None:
        return given
    from ..data.tokenize import ensure_local_python_corpus

    out = d.default_corpus_dir()
    if dist_info.is_main:
        log(f"data: no data.train_files given; using the local Python-source corpus at {out}")
        ensure_local_python_corpus(out, max_tokens=d.local_max_tokens or None, piece_chars=d.local_piece_chars)
    barrier()
    return find_shards(out, "train"), find_shards(out, "val")


def check_data_capacity(cfg: Config, plan: RunPlan, train_files: list[Path]):
    """Fail before training when the training shards cannot fill one step of some stage, or (crop with
    document caps) one row without repeating documents. Returns the crop's Coverage (data/coverage.py)
    for the start line, None when nothing is cropped to a cap."""
    from ..data.capacity import check_capacity

    lenient = cfg.data.on_bad_shard == "skip"
    for stage in plan.stages:
        rows, accum = plan.stage_batch(stage)
        check_capacity(train_files, seq_len=stage.seq_len, batch_size=rows, world_size=plan.world_size,
                       grad_accum=accum, lenient=lenient)
    capped = [s for s in plan.stages if s.max_doc_len]
    if cfg.data.long_docs != "crop" or cfg.data.packing != "greedy" or not capped:
        return None
    from ..data.coverage import read_coverage

    coverage = read_coverage(train_files, cfg.model.bos_id, lenient=lenient)
    for stage in capped:
        row = stage.seq_len + 1
        kept = coverage.kept(stage.max_doc_len, row)
        if kept < row:
            raise ConfigError(
                f"train.stages[{stage.index}].max_doc_len={stage.max_doc_len} with data.long_docs=crop keeps "
                f"{kept:,} tokens a pass of the training data ({coverage.documents:,} documents cut to "
                f"{stage.max_doc_len} tokens each), fewer than one row of seq_len+1={row}: too few documents for "
                f"a row; use --data.long_docs=mix or split (both keep every token), more documents or a smaller seq_len")
    return coverage


# Documents read for the start's window check when nothing else reads them (~0.3 s per 100M tokens).
WINDOW_SAMPLE_TOKENS = 200_000_000
# A cap is warned about when it leaves fewer than this share of the tokens that would have a whole window
# uncut: wave 5 saw validation rise at 15 % of 82 % (pieces <= 2,048, window 1,792) and not at 69 % (<= 8,192).
FULL_WINDOW_KEEP = 0.75


def document_sample(cfg: Config, plan: RunPlan, train_files: list[Path], crop_coverage=None):
    """The documents' lengths for data_epoch_lines' window check (data/coverage.py): the crop's exact
    Coverage where there is one, else the first shards' (WINDOW_SAMPLE_TOKENS); None when the last stage
    (the one checked) does not cut documents to a cap."""
    if cfg.data.packing != "greedy" or not plan.stages[-1].max_doc_len:
        return None
    if crop_coverage is not None:
        return crop_coverage
    from ..data.coverage import read_coverage

    return read_coverage(train_files, cfg.model.bos_id, lenient=cfg.data.on_bad_shard == "skip",
                         max_tokens=WINDOW_SAMPLE_TOKENS)


def train_loader(cfg: Config, train_files: list[Path], dist_info: DistInfo, micro_batch: int, grad_accum: int):
    from ..data.loader import TokenLoader

    d = cfg.data
    return TokenLoader(train_files, seq_len=d.seq_len, batch_size=micro_batch, rank=dist_info.rank,
                       world_size=dist_info.world_size, device=dist_info.device, seed=cfg.train.seed,
                       packing=d.packing, grad_accum=grad_accum, on_bad_shard=d.on_bad_shard,
                       vocab_size=cfg.model.vocab_size, bos_id=cfg.model.bos_id, long_docs=d.long_docs,
                       continued_bos=d.continued_bos, mix_docs=d.mix_docs, shuffle_first_epoch=d.shuffle_first_epoch)


def choose_strategy(cfg: Config, world_size: int, device: torch.device, log):
    """(parallel.strategy resolved, memory estimate): "auto" is ddp if its estimate fits the device,
    else fsdp; the estimate is printed. Raises ConfigError naming the knobs when it cannot fit."""
    from ..device import resolve_dtype
    from ..parallel.memory import choose_strategy as choose

    dtype_bytes = resolve_dtype(cfg.train.dtype, device).itemsize
    strategy, est = choose(cfg, world_size, device, dtype_bytes=dtype_bytes)
    log(f"memory: {est.describe()}")
    return strategy, est


def build_model(cfg: Config, device: torch.device, world_size: int, strategy: str) -> GPT:
    """The model on `device`, sharded under fsdp (compile.py compiles it, block by block there). Its
    windows are the finished model's (sampling, FLOP counts); training and validation pass each step's
    own windows to the forward."""
    if strategy == "fsdp":
        from ..parallel.dist import ensure_process_group
        from ..parallel.fsdp import build_fsdp_model

        ensure_process_group(device)
        return build_fsdp_model(cfg, device, world_size)  # compiled block by block (compile.py)
    return model_from_config(cfg, device, world_size=world_size)


def check_row_lengths(cfg: Config, plan: RunPlan, model: GPT, device: torch.device, world_size: int,
                      val_batch_rows: int) -> None:
    """FlexAttention's masks come in blocks of schedule.window_block: every row length must be a multiple. sdpa's
    dense masks must fit the device (parallel/memory.py check_dense_masks); `val_batch_rows`: the rows of
    validation's largest batch."""
    rt, d = model.runtime, cfg.data
    block = rt.window_block
    lengths = [("data.seq_len", d.seq_len), ("data.val_seq_len", d.val_seq_len)]
    lengths += [(f"train.stages[{s.index}].seq_len", s.seq_len) for s in plan.stages if plan.from_table]
    for key, length in lengths:
        if rt.attn_backend == "flex" and length % block:
            raise ConfigError(f"{key}={length} must be a multiple of schedule.window_block={block} for "
                              f"FlexAttention; use {max(block, length // block * block)} or "
                              f"--model.attn_backend=sdpa")
    if rt.attn_backend == "sdpa" and cfg.model.doc_masking:
        shapes = [("data.val_seq_len" if d.val_seq_len else "data.seq_len", val_batch_rows, d.val_seq_len or d.seq_len,
                   False)]
        shapes += [(f"train.stages[{s.index}].seq_len" if plan.from_table else "data.seq_len",
                    plan.stage_batch(s)[0], s.seq_len, True) for s in plan.stages]
        from ..parallel.memory import SdpaMasks, check_dense_masks

        attention = SdpaMasks(mask_keys=tuple(model.mask_keys),
                              layer_keys=tuple(b.attn.mask_key for b in model.blocks if b.attn is not None),
                              copy_bytes=rt.dtype.itemsize, checkpointed=cfg.parallel.activation_checkpointing)
        check_dense_masks(shapes, attention, device, cfg, world_size)


def fallback_notes(cfg: Config, model: GPT, device: torch.device) -> list[str]:
    """A line for each switch that cannot take effect here, saying what runs instead: the model's own dtype."""
    rt, notes = model.runtime, []
    where = device.type if device.type != "cuda" else "this GPU"
    dtype = str(rt.dtype).removeprefix("torch.")
    if cfg.model.fp8_head and not rt.fp8_head:
        notes.append(f"fp8 head: not supported on {where} (needs CUDA capability >= 8.9); "
                     f"the head runs in {dtype} like the rest of the model")
    if cfg.model.fp8_mlp and not any(b.mlp.fp8_scaling for b in model.blocks):
        notes.append(f"fp8 mlp: not supported on {where} (needs CUDA capability >= 8.9 and MLP widths that are "
                     f"multiples of 16); the MLP runs in {dtype} like the rest of the model")
    if cfg.model.fp8_attn and not any(b.attn is not None and b.attn.fp8_scaling for b in model.blocks):
        notes.append(f"fp8 attn: not supported on {where} (needs CUDA capability >= 8.9 and attention widths "
                     f"that are multiples of 16); the attention projections run in {dtype} like the rest of "
                     f"the model")
    if cfg.model.fused_ce and not rt.fused_ce:
        notes.append(f"fused ce: not supported on {where} (needs CUDA and Triton); the loss runs as PyTorch ops "
                     f"in float32")
    return notes


def describe_run(cfg: Config, model: GPT, plan: RunPlan, strategy: str, device: torch.device) -> list[str]:
    """The lines setup prints: the model, its active share under experts, and the batch (or the stage table)."""
    rt = model.runtime
    lines = [f"model: {model.num_params() / 1e6:.1f}M parameters ({model.num_params(False) / 1e6:.1f}M "
             f"non-embedding), depth {cfg.model.depth}, width {cfg.model.resolved_dim()}, attention "
             f"{rt.attn_backend}, device {device}, dtype {rt.dtype}, strategy {strategy}"]
    if cfg.model.moe_experts:
        lines.append(f"experts: {model.active_params() / 1e6:.1f}M parameters active per token (MFU counts these)")
    return lines + plan.batch_lines()


def _window_warning(cfg: Config, cap: int, window: int, who: str, key: str, documents) -> list[str]:
    """The warning for a cap that takes most whole attention windows away; without the documents'
    lengths, for a cap shorter than the window."""
    if documents is None:
        if cap >= window:
            return []
        return [f"warning: {who} cuts documents into pieces of <= {cap} tokens, shorter than its long attention "
                f"window of {window}: validation on long documents may rise as windows grow; raise {key} to >= "
                f"{window} (0: no cap)"]
    crop = cfg.data.long_docs == "crop"
    capped, whole = documents.full_window_share(cap, window, crop=crop), documents.full_window_share(0, window)
    if capped >= FULL_WINDOW_KEEP * whole:
        return []
    enough = next((c for c in (2 ** k for k in range(7, 24)) if c > cap and
                   documents.full_window_share(c, window, crop=crop) >= FULL_WINDOW_KEEP * whole), 0)
    return [f"warning: {who} cuts documents into pieces of <= {cap} tokens: {capped:.0%} of its training tokens "
            f"have a whole {window}-token window of their own document behind them, {whole:.0%} uncut; validation "
            f"on long documents may rise as windows grow (docs/data.md); "
            + (f"raise {key} to >= {enough} ({FULL_WINDOW_KEEP:.0%} of the uncut share) or 0 (no cap)"
               if enough else f"set {key} to 0 (no cap)")]


def mix_preview(plan: RunPlan, loader) -> list[float]:
    """long_docs=mix: the mean distinct documents per row of a micro-batch of each stage's shape, planned
    from the loader's position without handing it out; [] otherwise."""
    return [docs for s in plan.stages
            if (docs := loader.preview_docs_per_row(plan.stage_batch(s)[0], s.seq_len, s.max_doc_len)) is not None]


def data_epoch_lines(cfg: Config, plan: RunPlan, corpus_tokens: int, docs_per_row: list[float] = (),
                     coverage=None, documents=None) -> list[str]:
    """What the run will read against the training shards' size, and a warning when that is more than
    one epoch: from that step on the model sees repeated data (documents reshuffled each later epoch).
    With long_docs=mix, `docs_per_row` of each stage (`mix_preview`). `coverage` (crop with document caps:
    check_data_capacity's): epochs count passes over the tokens the crop keeps, not over the shards, and a
    loud warning says when the crop cuts more than half. `documents` (document_sample's): a last stage whose
    cap takes most of the whole attention windows away is warned about (without it: a cap shorter than the
    window)."""
    total, passes, repeat_step = 0, 0.0, None
    for stage in plan.stages:
        # A pass of this stage's rows reads the tokens its cap keeps (all of them when nothing is cut).
        per_pass = coverage.kept(stage.max_doc_len, stage.seq_len + 1) if coverage is not None else corpus_tokens
        for step in range(stage.start, stage.end):
            total += stage.batch_tokens
            passes += stage.batch_tokens / per_pass
            if repeat_step is None and passes > 1:
                repeat_step = step
    skips = cfg.data.long_docs == "crop" or cfg.data.packing == "record28"
    # Without a cap, crop (and record28) skip only the tail the row's end cuts, which the data's lengths
    # alone do not tell: "or more".
    more = " or more (document tails are skipped: cropped_share in the log)" if skips else ""
    lines = [f"data: {total:,} tokens in {cfg.train.steps} steps, from training shards of {corpus_tokens:,} tokens"]
    if coverage is None:
        lines[0] += f": {total / corpus_tokens:.2f} epochs{more}"
    else:
        cap_list = sorted({s.max_doc_len for s in plan.stages if s.max_doc_len})
        caps, cut = "/".join(map(str, cap_list)), int((coverage.lengths > cap_list[0]).sum())
        per_pass = total / passes  # the tokens a pass keeps, over the run's stages
        lines[0] += (f"; data.long_docs=crop cuts documents to {caps} tokens and keeps about {per_pass:,.0f} of "
                     f"them a pass: {passes:.2f} passes")
        if per_pass < corpus_tokens / 2:
            lines.append(f"warning: data.long_docs=crop cuts {1 - per_pass / corpus_tokens:.1%} of the training "
                         f"tokens ({cut:,} of its {coverage.documents:,} documents are longer than max_doc_len "
                         f"{caps}; their tails are skipped): the run reads about {per_pass:,.0f} distinct tokens, "
                         f"{passes:.2f} times; use --data.long_docs=mix (or split) to train on all of them")
    if cfg.data.long_docs == "mix":
        lines.append(f"data: rows mix pieces of {cfg.data.mix_docs} open documents (long_docs=mix); distinct "
                     f"documents per row in a micro-batch planned at the start with each stage's shape: "
                     + " / ".join(f"{docs:.1f}" for docs in docs_per_row))
    # Short pieces: the model hardly trains on a whole window of one document. Only the last stage, the one
    # the final model is fitted on, is held to it: record #72 caps its early stages on purpose.
    stage = plan.stages[-1]
    if stage.max_doc_len:
        window = max(plan.windows_at(step)[0] for step in range(stage.start, stage.end))
        who, key = ((f"stage {stage.index}", f"train.stages[{stage.index}].max_doc_len") if plan.from_table
                    else ("the run", "data.max_doc_len"))
        lines += _window_warning(cfg, stage.max_doc_len, window, who, key, documents)
    if repeat_step is not None:
        lines.append(f"warning: more than one epoch of data: from about step {repeat_step} on the run trains on "
                     f"repeated documents; use more data (or fewer steps) for a run that sees each token once")
    return lines
