"""The official `openai` client against the real server: completions and chat, streamed and not.

Every reply is compared with the generation engine run in-process on the same checkpoint
(exact text equality: greedy, or sampled with the same seed)."""

from __future__ import annotations

import openai
import pytest
import torch

from scratchlm.generate import generate
from scratchlm.generate.sampling import apply_frequency_presence_penalty

from tiny_checkpoint import MODEL
from serve_helpers import client, ref_chat, ref_completion

PROMPT = "ROMEO:\nBut soft, what light"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Who is there?"}]


def test_models_list_and_retrieve(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client(server).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client(server).models.retrieve("gpt-9")


def test_completion_greedy_matches_engine(server, reference):
    out = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    expected = ref_completion(reference, PROMPT, 24)
    assert out.choices[0].text == expected
    _, tok = reference
    assert out.usage.prompt_tokens == len(tok.encode(PROMPT))
    assert out.usage.completion_tokens == 24
    assert out.usage.total_tokens == out.usage.prompt_tokens + 24
    assert out.choices[0].finish_reason == "length"


def test_completion_streamed_equals_non_streamed(server):
    c = client(server)
    whole = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, seed=3)
    chunks = list(c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, seed=3,
                                       stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len([ch for ch in chunks if ch.choices and ch.choices[0].text]) > 1  # it really streamed


def test_chat_greedy_matches_engine_streamed_and_not(server, reference):
    c = client(server)
    whole = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0)
    stream = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    expected = ref_chat(reference, CHAT, 20)
    assert whole.choices[0].message.content == expected
    assert text == expected
    assert whole.choices[0].message.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_chat_sampled_with_seed_matches_engine(server, reference):
    kw = dict(max_tokens=25, temperature=0.9, top_p=0.9, seed=11)
    c = client(server)
    whole = c.chat.completions.create(model=MODEL, messages=CHAT, **kw)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(model=MODEL, messages=CHAT, stream=True, **kw))
    expected = ref_chat(reference, CHAT, 25, temperature=0.9, top_p=0.9, seed=11)
    assert whole.choices[0].message.content == expected == streamed


def test_n_choices_use_seed_plus_index(server, reference):
    out = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=1.0, n=3,
                                            seed=100)
    assert [ch.index for ch in out.choices] == [0, 1, 2]
    texts = [ch.text for ch in out.choices]
    assert texts == [ref_completion(reference, PROMPT, 12, temperature=1.0, seed=100 + j) for j in range(3)]
    model, tok = reference
    stops = [tok.special_token_ids["<|endoftext|>"], tok.special_token_ids["<|im_end|>"]]
    lengths = [len(generate(model, [tok.encode(PROMPT)], 12, stop_token_ids=stops, temperature=1.0, seed=100 + j)[0])
               for j in range(3)]
    assert out.usage.completion_tokens == sum(lengths)  # the stop token counts, as in OpenAI's usage


def test_stop_string_cuts_text(server, reference):
    full = ref_completion(reference, PROMPT, 40)
    stop = full[10:13]
    cut = full[: full.index(stop)]
    c = client(server)
    out = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop])
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in
                       c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                            stream=True))
    assert streamed == cut


def test_penalties_match_reference_loop(server, reference):
    """Greedy with OpenAI penalties on the tokens generated so far, vs a full-forward reference loop."""
    model, tok = reference
    ids = tok.encode(PROMPT)
    counts = torch.zeros(1, model.config.vocab_size)
    new: list[int] = []
    with torch.no_grad():
        for _ in range(20):
            logits = model(torch.tensor([ids + new]))[:, -1]
            nxt = int(apply_frequency_presence_penalty(logits, counts, 0.7, 1.2).argmax())
            new.append(nxt)
            counts[0, nxt] += 1
    out = client(server).completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0,
                                            frequency_penalty=0.7, presence_penalty=1.2)
    assert out.choices[0].text == tok.decode(new)
    plain = client(server).completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0)
    assert plain.choices[0].text != out.choices[0].text  # the penalties changed something


def test_default_binding_is_loopback(server):
    assert server.url.startswith("http://127.0.0.1:")


def test_several_prompts_times_n(server, reference):
    prompts = ["KING HENRY", "O, what a rogue"]
    out = client(server).completions.create(model=MODEL, prompt=prompts, max_tokens=8, temperature=0, n=2)
    assert [ch.index for ch in out.choices] == [0, 1, 2, 3]
    expected = [ref_completion(reference, p, 8) for p in prompts for _ in range(2)]
    assert [ch.text for ch in out.choices] == expected
    _, tok = reference
    assert out.usage.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-8])
def test_tiny_temperature_is_the_greedy_limit(server, reference, temperature):
    """l / T overflows float32 for tiny T (inf - inf = NaN in softmax); the answer must be the greedy one."""
    out = client(server).completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=temperature,
                                            seed=4)
    assert out.choices[0].text == ref_completion(reference, PROMPT, 16)


def test_tiny_temperature_sampler_picks_the_argmax():
    from scratchlm.generate.sampling import SamplingParams, choose_next_token, make_generator

    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(0)) * 40
    for seed in range(5):
        picked = choose_next_token(logits, SamplingParams(temperature=1e-40), generator=make_generator(seed))
        assert picked.tolist() == logits.argmax(dim=-1).tolist()


def test_repetition_penalty_matches_reference_loop(server, reference):
    """The repetition_penalty extension (HF's definition, on the generated tokens) against a full-forward loop."""
    from scratchlm.generate.sampling import apply_repetition_penalty

    model, tok = reference
    ids = tok.encode(PROMPT)
    counts = torch.zeros(1, model.config.vocab_size)
    new: list[int] = []
    with torch.no_grad():
        for _ in range(16):
            nxt = int(apply_repetition_penalty(model(torch.tensor([ids + new]))[:, -1], counts, 1.8).argmax())
            new.append(nxt)
            counts[0, nxt] += 1
    out = client(server).completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0,
                                            extra_body={"repetition_penalty": 1.8})
    assert out.choices[0].text == tok.decode(new)
