"""The chat session's KV cache across turns (speedgpt/chat/session.py) and the web chat over HTTP on
127.0.0.1 (serve.py), on a tiny randomly initialized chat model."""

from __future__ import annotations

import http.client
import json
import threading

import pytest
import torch

from conftest import TINY_OVERRIDES

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def chat_model():
    from speedgpt.chat.template import ChatTemplate, chat_vocab_size
    from speedgpt.config import apply_overrides, load_preset
    from speedgpt.model.build import model_from_config
    from speedgpt.tokenizer.core import gpt2_tokenizer

    tok = gpt2_tokenizer()
    cfg = apply_overrides(load_preset("tiny-cpu"), TINY_OVERRIDES + [f"--model.vocab_size={chat_vocab_size(tok)}"])
    torch.manual_seed(0)
    model = model_from_config(cfg, "cpu")
    with torch.no_grad():  # a random model whose greedy answers are not all one token
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model.eval(), ChatTemplate(tok)


def session(chat_model, **kw):
    from speedgpt.chat.session import ChatSession

    model, template = chat_model
    return ChatSession(model, template, temperature=0.0, max_new_tokens=6, **kw)


def reference(chat_model, prompt_ids) -> str:
    """Greedy answer recomputed from scratch, no cache: what the cached session must equal."""
    from speedgpt.infer.generate import generate_batch

    model, template = chat_model
    ids = generate_batch(model, [prompt_ids], 6, temperature=0.0, use_cache=False,
                         stop_token=template.assistant_end)[0]
    return template.tokenizer.decode([t for t in ids if t < template.tokenizer.vocab_size])


def test_kv_cache_across_turns_equals_recompute(chat_model):
    template = chat_model[1]
    chat = session(chat_model)
    answer = chat.reply("Hello")
    first_prompt = list(chat.ids)
    assert first_prompt == template.render_prompt([{"role": "user", "content": "Hello"}])
    first = "".join(answer)
    fed = chat.cache.pos
    answer = chat.reply("What is 2 + 2?")
    second_prompt = list(chat.ids)  # the history, the assistant's own sampled ids included
    second = "".join(answer)
    assert chat.cache.pos > fed and chat.ids[-1] == template.assistant_end
    assert first and first == reference(chat_model, first_prompt)
    assert second == reference(chat_model, second_prompt)
    chat.clear()
    assert chat.ids == [template.bos] and chat.cache.pos == 0


@pytest.fixture(scope="module")
def server(chat_model):
    from speedgpt.chat.serve import make_server

    srv = make_server(lambda: session(chat_model), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_page_and_streamed_answer_over_http(server, chat_model):
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=60)
    conn.request("GET", "/?q=hello")
    page = conn.getresponse()
    assert page.status == 200 and b"New conversation" in page.read()
    messages = [{"role": "user", "content": "Hello"}]
    conn.request("POST", "/chat", body=json.dumps({"messages": messages}), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
    lines = [json.loads(line) for line in resp.read().decode().splitlines()]
    text = "".join(line["text"] for line in lines if "text" in line)
    assert text == reference(chat_model, chat_model[1].render_prompt(messages))
    # the same answer in a session of its own says whether it ran into --max-tokens: the stream's last line says so
    from speedgpt.chat.session import cut_reason

    alone = session(chat_model)
    alone.load(messages)
    assert "".join(alone.answer()) == text
    cut = [line for line in lines if "cut" in line]
    assert cut == ([{"cut": cut_reason(alone)}] if alone.cut else []) and (not cut or lines[-1] == cut[0])
    conn.request("POST", "/chat", body=b'{"messages": [{"role": "wizard", "content": "x"}]}')
    bad = conn.getresponse()
    assert bad.status == 400 and b"unknown role" in bad.read()


def test_an_answer_cut_short_says_why(chat_model, monkeypatch):
    """An answer that stops before its <|assistant_end|> (max_new_tokens, a full context) is marked, so `chat` can
    say it was cut (a --prompt answer once ended silently at the context, exit 0); one that ends is not."""
    from speedgpt.chat import session as session_module
    from speedgpt.chat.session import cut_reason

    model, template = chat_model
    word = template.tokenizer.encode(" word")[0]
    picks = iter([word] * 6 + [template.assistant_end])
    monkeypatch.setattr(session_module, "pick_tokens", lambda *a: torch.tensor([[next(picks)]]))
    chat = session(chat_model)  # max_new_tokens=6
    assert "".join(chat.reply("hi")) == " word" * 6 and chat.cut == "tokens"
    assert cut_reason(chat) == "cut at --max-tokens 6"
    "".join(chat.reply("again"))  # the next pick ends the answer
    assert chat.cut is None
    picks = iter([word] * 1000)
    chat = session_module.ChatSession(model, template, temperature=0.0, max_new_tokens=1000)
    "".join(chat.reply("hi"))
    assert chat.cut == "context" and len(chat.ids) == chat.context + 1  # every position, then the closing end
    assert cut_reason(chat) == f"cut: the conversation fills the model's context ({chat.context} tokens)"


GET_PAGE = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("head", [b"POST /chat HTTP/1.1\r\nContent-Length: %d\r\n" % (1 << 21),
                                  b"POST /nowhere HTTP/1.1\r\nContent-Length: %d\r\n" % len(GET_PAGE)],
                         ids=["body over MAX_BODY", "a path that is not /chat"])
def test_a_refused_post_closes_its_connection(server, head):
    """A POST refused before its body was read left the body on the kept-alive connection, where it was parsed as the
    next request: here a body that is a GET got a second response, the page, which a client reusing the connection
    took for the answer to its next request. Now the refusal closes the connection."""
    import socket

    with socket.create_connection(("127.0.0.1", server), timeout=60) as s:
        s.sendall(head + b"Host: x\r\n\r\n" + GET_PAGE)
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith((b"HTTP/1.1 400", b"HTTP/1.1 404")) and got.count(b"HTTP/1.1 ") == 1, got[:300]


@pytest.mark.parametrize("text", ["", "  \n"])
def test_an_empty_message_is_refused_as_the_template_refuses_one(chat_model, text):
    """`chat --prompt ""` was answered from an empty user turn, exit 0, where the web page and SFT data refuse one."""
    from speedgpt.chat.template import ConversationError

    chat = session(chat_model)
    with pytest.raises(ConversationError, match="the message is empty; give the text to answer"):
        chat.reply(text)
    assert chat.ids == [chat_model[1].bos]  # nothing added to the conversation
