"""The chat template in a Hugging Face export: transformers' apply_chat_template on the exported tokenizer
files gives the ids speedgpt's template renders (speedgpt/hf/tokenizer_files.py, chat/template.py)."""

from __future__ import annotations

import pytest
from extraskit import requires_hf

pytestmark = pytest.mark.usefixtures("hf_offline")

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 7?"},
                {"role": "assistant", "content": "19"}, {"role": "user", "content": "Spell 'cat'."},
                {"role": "assistant", "content": "c-a-t"}]


@requires_hf
def test_apply_chat_template_equals_render(tmp_path):
    import transformers
    from speedgpt.chat.template import ChatTemplate
    from speedgpt.hf.tokenizer_files import write_tokenizer_files
    from speedgpt.tokenizer.core import gpt2_tokenizer

    template = ChatTemplate(gpt2_tokenizer())
    write_tokenizer_files(tmp_path, template.tokenizer, model_max_length=1024, chat=True)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))

    def ids(messages, **kw):
        out = hf.apply_chat_template(messages, tokenize=True, **kw)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    assert ids(CONVERSATION) == template.render(CONVERSATION)[0]
    prompt = CONVERSATION[:4]
    assert ids(prompt, add_generation_prompt=True) == template.render_prompt(prompt)
    assert hf.decode(template.render(CONVERSATION)[0][-3:]) == "-t<|assistant_end|>"
