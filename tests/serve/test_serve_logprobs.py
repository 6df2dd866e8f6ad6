"""logprobs / top_logprobs (chat and completions) and echo, through the official openai client, streamed and
not: every value equals torch.log_softmax of the model's logits from a full forward pass of the prompt plus
the generated tokens (the reference), and the top-N ids are torch.topk of those."""

from __future__ import annotations

import pytest
import torch

from scratchlm.tokenizer import render_chat

from serve_helpers import client
from tiny_checkpoint import MODEL

PROMPT = "ROMEO:\nBut soft, what light"
CHAT = [{"role": "user", "content": "Who is there?"}]
TOL = 1e-4


def reference_logprobs(reference, prompt_ids: list[int], new_ids: list[int]) -> torch.Tensor:
    """log_softmax over the vocabulary at every position of prompt + new (T, V), one forward pass."""
    model, _ = reference
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([prompt_ids + new_ids]))[0].double(), dim=-1)


def test_completion_logprobs_match_log_softmax(server, reference):
    _, tok = reference
    ids = tok.encode(PROMPT)
    out = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    generated = reference_generated(reference, ids, 12)
    lsm = reference_logprobs(reference, ids, generated)
    assert len(lp.token_logprobs) == len(generated) == 12
    for i, t in enumerate(generated):
        row = lsm[len(ids) + i - 1]
        assert lp.token_logprobs[i] == pytest.approx(float(row[t]), abs=TOL)
        best = torch.topk(row, 3)
        assert list(lp.top_logprobs[i].values()) == pytest.approx(best.values.tolist(), abs=TOL)
        assert list(lp.top_logprobs[i]) == [token_text(tok, j) for j in best.indices.tolist()]
        assert lp.tokens[i] == token_text(tok, t)
    text = out.choices[0].text
    assert all(text[o:].startswith(t) for o, t in zip(lp.text_offset, lp.tokens) if not t.startswith("bytes:"))


def token_text(tok, token: int) -> str:
    raw = tok.decode_bytes([token])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def reference_generated(reference, prompt_ids: list[int], n: int, stop: set[int] = frozenset()) -> list[int]:
    """Greedy continuation by full forward passes (no cache), stopping before a stop token."""
    model, _ = reference
    new: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([prompt_ids + new]))[0, -1].argmax())
            if nxt in stop:
                break
            new.append(nxt)
    return new


def test_completion_logprobs_streamed_equal_non_streamed(server):
    c = client(server)
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0.8, seed=5, logprobs=2)
    whole = c.completions.create(**kw).choices[0].logprobs
    tokens, lps, tops, offsets = [], [], [], []
    for ch in c.completions.create(stream=True, **kw):
        if ch.choices and ch.choices[0].logprobs:
            lp = ch.choices[0].logprobs
            tokens += lp.tokens
            lps += lp.token_logprobs
            tops += lp.top_logprobs
            offsets += lp.text_offset
    assert tokens == whole.tokens and offsets == whole.text_offset
    assert lps == pytest.approx(whole.token_logprobs, abs=1e-6)
    assert [list(t) for t in tops] == [list(t) for t in whole.top_logprobs]


def test_echo_scores_the_prompt(server, reference):
    _, tok = reference
    ids = tok.encode(PROMPT)
    out = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    choice = out.choices[0]
    assert choice.text == PROMPT and out.usage.completion_tokens == 0 and choice.finish_reason == "length"
    lp = choice.logprobs
    lsm = reference_logprobs(reference, ids, [])
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.tokens == [token_text(tok, t) for t in ids] and lp.text_offset[0] == 0
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(lsm[i - 1, ids[i]]), abs=TOL)
        assert list(lp.top_logprobs[i].values()) == pytest.approx(torch.topk(lsm[i - 1], 2).values.tolist(), abs=TOL)
    streamed = [ch for ch in client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, echo=True,
                                                               temperature=0, logprobs=1, stream=True) if ch.choices]
    text = "".join(ch.choices[0].text for ch in streamed)
    gen = tok.decode(reference_generated(reference, ids, 3))
    assert streamed[0].choices[0].text == PROMPT and text == PROMPT + gen
    assert sum(len(ch.choices[0].logprobs.tokens) for ch in streamed if ch.choices[0].logprobs) == len(ids) + 3


def test_chat_logprobs_and_top_logprobs_streamed_and_not(server, reference):
    _, tok = reference
    ids, _ = render_chat(tok, CHAT, add_generation_prompt=True)
    stops = {tok.special_token_ids["<|im_end|>"], tok.special_token_ids["<|endoftext|>"]}
    generated = reference_generated(reference, ids, 10, stops)
    lsm = reference_logprobs(reference, ids, generated)
    c = client(server)
    out = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0, logprobs=True,
                                    top_logprobs=4)
    content = out.choices[0].logprobs.content
    assert [e.token for e in content] == [token_text(tok, t) for t in generated]
    for i, (e, t) in enumerate(zip(content, generated)):
        row = lsm[len(ids) + i - 1]
        assert e.logprob == pytest.approx(float(row[t]), abs=TOL) and e.bytes == list(tok.decode_bytes([t]))
        best = torch.topk(row, 4)
        assert [a.token for a in e.top_logprobs] == [token_text(tok, j) for j in best.indices.tolist()]
        assert [a.logprob for a in e.top_logprobs] == pytest.approx(best.values.tolist(), abs=TOL)
    streamed = []
    for ch in c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0, logprobs=True,
                                        top_logprobs=4, stream=True):
        if ch.choices and ch.choices[0].logprobs:
            streamed += ch.choices[0].logprobs.content
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in content]
    plain = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0, logprobs=True)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    none = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0)
    assert none.choices[0].logprobs is None
