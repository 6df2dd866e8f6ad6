"""Post-training JSONL datasets (tokenisation, line-numbered errors) and the named reward functions."""

from __future__ import annotations

import json

import pytest

from scratchlm.align.rewards import REWARDS, get_reward
from scratchlm.align.toy_task import byte_tokenizer
from scratchlm.data.align_data import (encode_chat, encode_preferences, encode_prompt, load_chat_jsonl,
                                       load_preference_jsonl, load_rl_prompts_jsonl)


def _write(tmp_path, lines, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return p


def test_chat_jsonl_tokenised_with_assistant_only_mask(tmp_path):
    conv = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    path = _write(tmp_path, [conv, "", conv])  # blank lines are skipped
    data = load_chat_jsonl(path)
    assert len(data) == 2
    tok = byte_tokenizer()
    ids, mask = encode_chat(tok, data)[0]
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    assert ids == tok.encode(text)
    trained = [i for i, m in zip(ids, mask) if m]
    assert tok.decode(trained) == "yo<|im_end|>"


@pytest.mark.parametrize("line,match", [
    ("{not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
    ('{"messages": []}', "line 2: field 'messages'"),
    ('{"messages": [{"role": "user"}]}', r"line 2: messages\[0\]"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "line 2: the conversation has no assistant"),
])
def test_chat_errors_name_the_line(tmp_path, line, match):
    good = json.dumps({"messages": [{"role": "assistant", "content": "a"}]})
    with pytest.raises(ValueError, match=match):
        load_chat_jsonl(_write(tmp_path, [good, line]))


def test_preference_jsonl_raw_and_chat_prompts(tmp_path):
    rows = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"},
            {"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}]
    pairs = load_preference_jsonl(_write(tmp_path, rows))
    tok = byte_tokenizer()
    (p0, c0, r0), (p1, c1, r1) = encode_preferences(tok, pairs)
    eot, im_end = tok.special_token_ids["<|endoftext|>"], tok.special_token_ids["<|im_end|>"]
    assert p0 == tok.encode("1+1=") and c0 == tok.encode("2") + [eot] and r0 == tok.encode("3") + [eot]
    assert p1 == tok.encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n") and c1[-1] == im_end
    with pytest.raises(ValueError, match="line 1: field 'rejected'"):
        load_preference_jsonl(_write(tmp_path, [{"prompt": "x", "chosen": "y"}], "bad.jsonl"))


def test_rl_prompts_reward_names(tmp_path):
    path = _write(tmp_path, [{"prompt": "2+2=", "answer": "4"}, {"prompt": "x", "reward": "contains", "answer": "y"}])
    data = load_rl_prompts_jsonl(path, default_reward="exact_match")
    assert [d.reward for d in data] == ["exact_match", "contains"] and data[0].fields == {"answer": "4"}
    with pytest.raises(ValueError, match="line 1: reward None is not a known reward"):
        load_rl_prompts_jsonl(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rl_prompts_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="no RL prompt records"):
        load_rl_prompts_jsonl(_write(tmp_path, [""], "empty.jsonl"))
    assert encode_prompt(byte_tokenizer(), data[0].prompt) == list(b"2+2=")


@pytest.mark.parametrize("name,completion,fields,expect", [
    ("exact_match", " 7 ", {"answer": "7"}, 1.0),
    ("exact_match", "17", {"answer": "7"}, 0.0),
    ("numeric_match", "so it is 3.0", {"answer": "3"}, 1.0),
    ("numeric_match", "3 then 4", {"answer": "3"}, 0.0),
    ("numeric_match", "none", {"answer": "3"}, 0.0),
    ("contains", "the answer is 42.", {"answer": "42"}, 1.0),
    ("regex_match", "abc123", {"pattern": "[a-c]+\\d+"}, 1.0),
    ("regex_match", "abcx", {"pattern": "[a-c]+\\d+"}, 0.0),
    ("plus_minus", "7", {"answer": "7"}, 1.0),
    ("plus_minus", "8", {"answer": "7"}, -1.0),
])
def test_rewards(name, completion, fields, expect):
    assert get_reward(name)(completion, fields) == expect


def test_reward_errors():
    with pytest.raises(ValueError, match="unknown reward function 'bleu'"):
        get_reward("bleu")
    with pytest.raises(ValueError, match="needs the field 'answer'"):
        REWARDS["exact_match"]("x", {})
