"""`speedgpt export RUN --format hf`: a folder that Hugging Face transformers and lm-evaluation-harness
load (`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`); its layout: hf/folder.py.

The model is rebuilt by speedgpt from the checkpoint (as `speedgpt sample` does, at the checkpoint's
step: its windows and YaRN state), and its resolved structure is written into config.json layer
by layer, so the modeling file reads numbers, never training schedules. Writing needs neither
transformers nor tokenizers; loading needs transformers (the `hf` extra), which the export says
when it is missing.
"""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path

import torch

from .features import check_supported
from .folder import CONFIG, MODEL_TYPE, WEIGHTS, hf_state
from .tokenizer_files import write_tokenizer_files

CODE_FILES = ("configuration_speedgpt.py", "modeling_speedgpt.py")
GENERATION_CONFIG = "generation_config.json"
README = "README.md"
FORMAT = "hf"  # this exporter's name in the export manifest (rundir/export_dir.py)
TORCH_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def hf_config(model, cfg, provenance: dict, dtype: torch.dtype) -> dict:
    """config.json: the architecture of the built speedgpt `model`, resolved layer by layer."""
    from ..model.moe import MoE

    m = cfg.model
    blocks = list(model.blocks)
    attn = [b.attn for b in blocks]
    moe = next((b.mlp for b in blocks if isinstance(b.mlp, MoE)), None)
    yarn = model.runtime.yarn is not None
    freq = model.yarn_freq if yarn else model.rotary.frequencies()
    return {
        "architectures": ["SpeedGPTForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_speedgpt.SpeedGPTConfig",
                     "AutoModelForCausalLM": "modeling_speedgpt.SpeedGPTForCausalLM"},
        "model_type": MODEL_TYPE,
        "dtype": TORCH_DTYPE_NAMES[dtype],
        "vocab_size": m.padded_vocab(),
        "token_vocab_size": m.vocab_size,
        "hidden_size": m.resolved_dim(),
        "num_hidden_layers": m.depth,
        "num_attention_heads": m.resolved_heads(),
        "num_key_value_heads": m.resolved_kv_heads(),
        "head_dim": m.head_dim,
        "intermediate_size": int(m.mlp_ratio * m.resolved_dim()),
        "max_position_embeddings": model.rotary.max_seq_len,
        "rope_base": m.rope_base,
        "rope_half_truncate": m.rope_half_truncate,
        "rope_frequencies": [float(f) for f in freq.float().cpu().tolist()],
        "query_scale": float(model.yarn_scale) if yarn else None,
        "attention_scale": m.attn_scale or m.head_dim ** -0.5,
        "attention_windows": [int(w) for w in model.windows],
        "window_block": model.runtime.window_block,
        "layer_windows": model.window_keys,
        "attention_free_layers": [i for i, a in enumerate(attn) if a is None],
        "paired_head_layers": [i for i, a in enumerate(attn) if a is not None and a.paired],
        "key_offset_layers": [i for i, a in enumerate(attn) if a is not None and a.key_offset],
        "value_embed_slots": [m.value_embed_slot(i) if len(model.value_embeds) else None for i in range(m.depth)],
        "num_value_embeds": len(model.value_embeds),
        "value_embed_gates": m.value_embed_gates,
        "attn_gate": m.attn_gate,
        "gate_dim": m.attn_gate_dim,
        "unet_skips": m.unet_skips,
        "skip_gates": m.skip_gates,
        "x0_mixing": m.x0_mixing,
        "smear": m.smear,
        "bigram_rows": model.bigram.rows if model.bigram is not None else 0,
        "backout_layer": m.backout_layer,
        "logit_softcap": m.logit_softcap,
        "logit_rescale": m.logit_rescale,
        "doc_masking": m.doc_masking,
        "moe_experts": m.moe_experts,
        "moe_top_k": m.moe_top_k,
        "moe_shared_experts": m.moe_shared_experts,
        "moe_dense_layers": m.moe_dense_layers,
        "moe_hidden": moe.hidden if moe is not None else 0,
        "bos_token_id": m.bos_id,  # also the document boundary of doc_masking
        "eos_token_id": m.bos_id,
        "tie_word_embeddings": False,
        "use_cache": True,
        "speedgpt": {"config": cfg.to_dict(), "export": provenance},
    }


def generation_config(cfg, assistant_end: int | None = None) -> dict:
    """Stop at end-of-text, and a chat model (`assistant_end`: its <|assistant_end|> id) at the end of its answer
    too, as `speedgpt chat` does (without it generate ran on past the answer); never pick the padded vocabulary's
    ids (no token has them; `speedgpt sample` likewise picks among the tokenizer's ids only)."""
    bos = cfg.model.bos_id
    return {"bos_token_id": bos, "eos_token_id": bos if assistant_end is None else [bos, assistant_end],
            "pad_token_id": bos, "suppress_tokens": list(range(cfg.model.vocab_size, cfg.model.padded_vocab()))}


CHAT_USAGE = """
A chat model (fine-tuned by `speedgpt sft`): the tokenizer's chat template renders a conversation as in its
training, and generation stops at <|assistant_end|>:

```python
messages = [{"role": "user", "content": "What is 3 + 4?"}]
inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
out = model.generate(**inputs, max_new_tokens=64, do_sample=False)
print(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```
"""


def readme(provenance: dict, notes: list[str], chat: bool = False) -> str:
    dropped = "".join(f"- {n}\n" for n in notes) or "- nothing\n"
    # an SFT checkpoint counts steps, not tokens
    tokens = f", {provenance['tokens']:,} tokens" if isinstance(provenance.get("tokens"), int) else ""
    return f"""---
library_name: transformers
tags: [speedgpt]
---
# speedgpt model

Exported by `speedgpt export --format hf` from `{provenance['source']}` (step {provenance['step']}{tokens},
{provenance['dtype']} weights). The modeling code runs with `trust_remote_code=True`; it needs torch and
transformers only.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)  # puts <|endoftext|> (BOS) first, as in training
model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
out = model.generate(**tok("Once upon a time", return_tensors="pt"), max_new_tokens=32, do_sample=False)
print(tok.decode(out[0], skip_special_tokens=True))
```
{CHAT_USAGE if chat else ""}
lm-evaluation-harness: `lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True --tasks TASK`.

Dropped at export (training only):
{dropped}"""


def write_folder(folder: Path, model, cfg, tok, provenance: dict, dtype: torch.dtype, notes: list[str]) -> None:
    """Write every file of the export into `folder` (`tok`: the run's tokenizer); the export manifest
    lists what is there (rundir/export_dir.py)."""
    from safetensors.torch import save_file

    from ..export import scalar_param_names
    from ..tokenizer.folder import RUN_SUBDIR, copy_folder

    # Scalars (residual, value and skip lambdas, routers) and the experts' balancing bias stay fp32, as in
    # speedgpt's own bf16 export: a few hundred numbers whose precision matters more than their size.
    state = model.state_dict()
    keep_fp32 = scalar_param_names(cfg) | {k for k in state if k.endswith("expert_bias")}
    state = {k: (v.to(dtype) if v.is_floating_point() and k not in keep_fp32 else v) for k, v in state.items()}
    tensors = {k: v.detach().contiguous() for k, v in hf_state(state).items()}
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    from ..chat.template import ChatTemplate, chat_vocab_size

    chat = cfg.model.vocab_size == chat_vocab_size(tok)  # an SFT model
    assistant_end = ChatTemplate(tok).assistant_end if chat else None
    files = {CONFIG: hf_config(model, cfg, provenance, dtype),
             GENERATION_CONFIG: generation_config(cfg, assistant_end)}
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data, indent=1) + "\n")
    for name in CODE_FILES:  # the package's own modules, copied as they are (tests import them directly)
        (folder / name).write_text((resources.files("speedgpt.hf") / name).read_text(encoding="utf-8"),
                                   encoding="utf-8")
    (folder / README).write_text(readme(provenance, notes, chat))
    write_tokenizer_files(folder, tok, model_max_length=model.rotary.max_seq_len, chat=chat)
    # speedgpt's own tokenizer files too (GPT-2's: none), so `speedgpt sample / eval / chat` read the folder back
    copy_folder(tok, folder / RUN_SUBDIR)


def export_hf(source: str | Path, out: str | Path | None = None, *, dtype: str = "bf16",
              checkpoint: str | int | None = None) -> tuple[Path, list[str]]:
    """Write the Hugging Face folder `out` (default SOURCE/export-hf) from a run's latest (or named)
    checkpoint, or from an export. Returns (out, notes): what was dropped, and what loading needs.
    Written through rundir/export_dir.py like speedgpt's own export: a crash never leaves half a
    folder, a re-export replaces only its own files, a folder no export wrote is refused."""
    from .. import __version__
    from ..export import DTYPES, ExportError, export_source
    from ..infer.load import load_model
    from ..rundir.export_dir import export_files
    from ..tokenizer.folder import TokenizerError

    src, cfg, out, tok = export_source(source, out, dtype=dtype, checkpoint=checkpoint, default_out="default_hf_export")
    notes = check_supported(cfg)
    # fp32 masters on the CPU, windows and YaRN state of the checkpoint's step
    model, _ = load_model(source, device="cpu", checkpoint=checkpoint, dtype=torch.float32)
    provenance = {"source": str(src.root), "checkpoint": src.weights.name if src.kind == "run" else None,
                  "step": src.step, "tokens": src.tokens, "train_time_s": src.train_time_s, "dtype": dtype,
                  "speedgpt_version": __version__,
                  "embed_tied": model.embed_tied if model.tying is not None else None, "dropped": list(notes)}
    with export_files(out, FORMAT, src.root) as tmp:  # an export is meant to be shared: files get the umask's mode
        try:
            write_folder(tmp, model, cfg, tok, provenance, DTYPES[dtype], notes)
        except TokenizerError as e:
            raise ExportError(str(e)) from None
    if importlib.util.find_spec("transformers") is None:
        notes.append("loading this folder needs transformers: pip install 'speedgpt[hf]' (or transformers)")
    return out, notes
