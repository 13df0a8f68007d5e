"""The chat template's ids and assistant mask (speedgpt/chat/template.py), packing (pack.py) and the
built-in tasks (tasks.py): no model needed."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def template():
    from speedgpt.chat.template import ChatTemplate
    from speedgpt.tokenizer.core import gpt2_tokenizer

    return ChatTemplate(gpt2_tokenizer())


def test_render_worked_by_hand(template):
    # GPT-2: "Hi" = 17250, " there" = 612, "Hello" = 15496; the specials follow <|endoftext|> = 50256
    ids, mask = template.render([{"role": "system", "content": "Hello"}, {"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello there"},
                                 {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi"}])
    hello_nl_nl_hi = template.tokenizer.encode("Hello\n\nHi")  # the system message joins the first user turn
    assert ids == [50256, 50257, *hello_nl_nl_hi, 50258, 50259, 15496, 612, 50260,
                   50257, 17250, 50258, 50259, 17250, 50260]
    assert mask == [0, 0, *[0] * len(hello_nl_nl_hi), 0, 0, 1, 1, 1,
                    0, 0, 0, 0, 1, 1]


def test_prompt_ends_with_assistant_start(template):
    ids = template.render_prompt([{"role": "user", "content": "Hi"}])
    assert ids == [50256, 50257, 17250, 50258, 50259]


@pytest.mark.parametrize("messages, says", [
    ([], "non-empty list"),
    ([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}], "unknown role"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}], "empty content"),
    ([{"role": "assistant", "content": "a"}], "where 'user' was expected"),
    ([{"role": "user", "content": "a"}], "must end with an assistant"),
])
def test_bad_conversations(template, messages, says):
    from speedgpt.chat.template import ConversationError

    with pytest.raises(ConversationError, match=says):
        template.render(messages)


def test_specials_need_room_in_the_padded_vocab():
    from speedgpt.chat.template import ConversationError, check_room
    from speedgpt.config import ModelConfig
    from speedgpt.tokenizer.core import gpt2_tokenizer

    check_room(gpt2_tokenizer(), ModelConfig())  # 50257 + 6 <= 50304
    with pytest.raises(ConversationError, match="padded vocabulary"):
        check_room(gpt2_tokenizer(), ModelConfig(vocab_pad_multiple=1))


def test_packing_keeps_every_conversation_whole():
    import random

    from speedgpt.chat.pack import IGNORE, pack_rows, row_tensors

    rng = random.Random(0)
    convs = []
    for _ in range(300):
        n = rng.randrange(2, 40)
        convs.append(([7] + [rng.randrange(10, 100) for _ in range(n - 1)],
                      [0] + [rng.randrange(2) for _ in range(n - 1)]))
    rows = pack_rows(convs, 65, buffer=50)
    assert sorted(i for row in rows for i in row) == list(range(len(convs)))  # each exactly once
    assert all(sum(len(convs[i][0]) for i in row) <= 65 for row in rows)
    inputs, targets = row_tensors(convs, rows, 65, pad_id=7)
    for r, row in enumerate(rows):  # each conversation's tokens in order, at its offset, then padding
        flat = [t for i in row for t in convs[i][0]]
        assert inputs[r].tolist() == (flat + [7] * (65 - len(flat)))[:64]
        mask = [m for i in row for m in convs[i][1]][1:]
        kept = [t for t, m in zip(flat[1:], mask) if m]
        assert [t for t in targets[r].tolist() if t != IGNORE] == kept
    assert len(rows) <= 1.05 * sum(len(c[0]) for c in convs) / 65 + 1  # best fit: little padding
    # the fix named (the built-in tasks at --data.seq_len=16 said only "more than a row's 17")
    with pytest.raises(ValueError, match=r"70 tokens, more than a row's 65 \(data.seq_len \+ 1\); give "
                                         r"--data.seq_len=69 or more"):
        pack_rows([([1] * 70, [0] * 70)], 65)


def test_heldout_questions_never_in_training():
    from itertools import islice

    from speedgpt.chat.tasks import heldout, training_examples

    held = {e.question for e in heldout()}
    assert len(held) == 300
    assert not held & {e.question for e in islice(training_examples(0), 5000)}


def test_chat_eval_files_and_centring(tmp_path):
    from speedgpt.chat.evaluate import TaskScore, chatcore, normalize_answer, read_choice_file, read_exact_file

    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text('{"question": "q", "answer": "3 + 4 = 7\\n#### 1,007"}\n{"question": "r", "answer": "cat"}\n')
    assert read_exact_file(gsm) == [("q", "1,007"), ("r", "cat")]
    assert normalize_answer("so it is 1,007.") == normalize_answer("1,007") == "1007"
    assert normalize_answer(" c-a-t ") == "c-a-t"
    arc = tmp_path / "arc.jsonl"
    arc.write_text('{"question": "q", "choices": {"text": ["x", "y", "z"], "label": ["1", "2", "3"]}, '
                   '"answerKey": "3"}\n{"question": "r", "choices": ["a", "b"], "answer": "B"}\n')
    assert read_choice_file(arc) == [("q", ["x", "y", "z"], 2), ("r", ["a", "b"], 1)]
    arc.write_text('{"question": "q", "choices": ["a"], "answer": 0}\n')
    with pytest.raises(ValueError, match="line 1: not a multiple-choice item"):
        read_choice_file(arc)
    # an empty (or blank) file is refused, not scored as an accuracy of 0 over n=0
    for empty, read in ((tmp_path / "none.jsonl", read_exact_file), (tmp_path / "blank.jsonl", read_choice_file)):
        empty.write_text("" if read is read_exact_file else "\n  \n")
        with pytest.raises(ValueError, match=f"^{empty}: no examples"):
            read(empty)
    # centred: chance scores 0, perfect 1, whatever the number of choices
    assert chatcore([TaskScore("a", 0.25, 0.25, 4), TaskScore("b", 1.0, 0.5, 2), TaskScore("c", 0.5, 0.0, 2)]) \
        == pytest.approx((0 + 1 + 0.5) / 3)
