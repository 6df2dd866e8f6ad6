"""Step-level continuous batching vs the generation engine run on each request alone.

Sequences join at different steps, leave when done or cancelled; the reference decode ("model") attends over
the rows' block tables, the packed fast step over its window (which shifts rows right when a long prompt
joins at a small cursor and left when the cursor reaches its end); every surviving sequence must produce
exactly the tokens the engine produces for it alone, and every block goes back to the pool."""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.generate import generate
from scratchlm.generate.sampling import SamplingParams
from scratchlm.model import TransformerLM
from scratchlm.serve.scheduler import Scheduler
from scratchlm.serve.sequence import Finished, Sequence, TextDelta
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

CONTEXT = 40


def setup(max_batch: int = 4, decode: str = "model", prefill: str = "model"):
    torch.manual_seed(0)
    model = TransformerLM(get_preset("llama-tiny", vocab_size=259, d_model=64, n_layers=2, max_seq_len=CONTEXT,
                                     init_std=0.5)).eval()
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    return model, tok, Scheduler(model, max_batch=max_batch, decode=decode, prefill=prefill)


def random_jobs(n: int, seed: int) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    jobs = []
    for _ in range(n):
        p = int(torch.randint(1, 24, (1,), generator=g))
        prompt = torch.randint(0, 256, (p,), generator=g).tolist()
        jobs.append((prompt, min(int(torch.randint(1, 30, (1,), generator=g)), CONTEXT - p)))
    return jobs


def make_seq(tok, prompt, max_tokens, params=SamplingParams(), seed=None, events=None):
    sink = events.append if events is not None else (lambda e: None)
    return Sequence.create(0, prompt, max_tokens, params, sink, tokenizer=tok, vocab_size=259, seed=seed)


def run_staggered(sched: Scheduler, seqs: list[Sequence], join_every: int = 1) -> None:
    for s in seqs:
        sched.submit([s])
        for _ in range(join_every):
            sched.step()
    while sched.rows or sched.waiting:
        sched.step()


def torch_fast_step(monkeypatch) -> None:
    """Serve the fast modes through the torch fast step on SlotCache windows, as without the C++ kernels."""
    monkeypatch.setattr("scratchlm.serve.batch_rows.native_decoder", lambda model, mode: None)


@pytest.mark.parametrize("decode", ["model", "fast", "fast-staged"])
def test_greedy_join_and_leave_equals_engine_alone(decode, monkeypatch):
    if decode == "fast-staged":
        torch_fast_step(monkeypatch)
    model, tok, sched = setup(decode=decode.split("-")[0])
    jobs = random_jobs(14, seed=1)
    seqs = [make_seq(tok, p, m) for p, m in jobs]
    run_staggered(sched, seqs)
    for (prompt, max_tokens), s in zip(jobs, seqs):
        assert s.tokens == generate(model, [prompt], max_tokens)[0]
    assert sched.stats.max_active == 4 and sched.stats.completed == 14
    assert sched.space.pool.used == 0  # every block went back
    if decode == "fast-staged":  # the torch step's window: both room paths ran, empty at the end
        assert sched.slots.shifts["left"] > 0 and sched.slots.shifts["right"] > 0
        assert sched.slots.rows == 0 and sched.slots.cursor == 0


def test_bf16_prefill_is_generates_bf16_prefill(one_torch_thread):
    """The server prefills through generate's prefill: with prefill="bf16" every request's greedy tokens
    equal the engine's with the same prefill mode (and the bf16 K/V really differ from fp32's)."""
    model, tok, sched = setup(decode="fast", prefill="bf16")
    jobs = random_jobs(8, seed=3)
    seqs = [make_seq(tok, p, m) for p, m in jobs]
    run_staggered(sched, seqs, join_every=3)
    for (prompt, max_tokens), s in zip(jobs, seqs):
        assert s.tokens == generate(model, [prompt], max_tokens, prefill="bf16")[0]
    with pytest.raises(ValueError, match="unknown prefill mode 'fp8'"):
        Scheduler(model, prefill="fp8")


def test_sampled_rows_with_seeds_equal_engine_alone():
    model, tok, sched = setup()
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50)
    jobs = random_jobs(6, seed=2)
    seqs = [make_seq(tok, p, m, params, seed=40 + i) for i, (p, m) in enumerate(jobs)]
    run_staggered(sched, seqs, join_every=2)
    for i, ((prompt, max_tokens), s) in enumerate(zip(jobs, seqs)):
        ref = generate(model, [prompt], max_tokens, seed=40 + i, temperature=0.8, top_p=0.9, top_k=50)[0]
        assert s.tokens == ref


def test_cancel_frees_the_row_and_others_are_unaffected():
    model, tok, sched = setup(max_batch=3)
    jobs = [([5, 6, 7], 30), ([8, 9], 30), ([10], 30)]
    events: list = []
    seqs = [make_seq(tok, p, m, events=events if i == 1 else None) for i, (p, m) in enumerate(jobs)]
    sched.submit(seqs)
    for _ in range(3):
        sched.step()
    assert len(sched.rows) == 3
    sched.cancel([seqs[1]])
    waiting = make_seq(tok, [11, 12], 5)
    sched.submit([waiting])
    sched.step()
    assert seqs[1] not in sched.rows and waiting in sched.rows  # the freed row went to the waiting job
    assert sched.stats.cancelled == 1
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "cancelled"
    while sched.rows:
        sched.step()
    for (prompt, max_tokens), s in [(jobs[0], seqs[0]), (jobs[2], seqs[2]), (([11, 12], 5), waiting)]:
        assert s.tokens == generate(model, [prompt], max_tokens)[0]


def test_events_rebuild_the_text_and_end_with_finish():
    model, tok, sched = setup()
    events: list = []
    s = make_seq(tok, [72, 105], 12, events=events)
    run_staggered(sched, [s])
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == bytes(s.tokens).decode("utf-8", "replace")  # byte vocab: id == byte
    assert events[-1] == Finished(0, "length", 12)


def test_choices_of_one_prompt_share_one_prefill():
    model, tok, sched = setup(max_batch=8)
    shapes: list[tuple[int, int]] = []
    model.register_forward_pre_hook(lambda _, args: shapes.append(tuple(args[0].shape)))
    params = SamplingParams(temperature=1.0)
    prompt = [7, 8, 9, 10, 11]
    seqs = [make_seq(tok, prompt, 9, params, seed=s) for s in range(4)] + [make_seq(tok, [3, 4], 9, params, seed=9)]
    sched.submit(seqs)
    sched.step()
    assert shapes[0] == (2, 5)  # one prefill row per distinct prompt, not per choice
    assert shapes[1] == (5, 1)  # then every choice decodes in its own row
    while sched.rows:
        sched.step()
    for s, seed in zip(seqs, [0, 1, 2, 3, 9]):
        assert s.tokens == generate(model, [s.prompt], 9, seed=seed, temperature=1.0)[0]


@pytest.mark.parametrize("decode", ["model", "fast"])
def test_context_edge_prompts_join_a_running_batch(decode):
    """Prompts that fill the context exactly (P + max_tokens = M) join rows already running."""
    model, tok, sched = setup(decode=decode)
    g = torch.Generator().manual_seed(5)
    jobs = [(torch.randint(0, 256, (p,), generator=g).tolist(), m) for p, m in
            [(3, 30), (CONTEXT - 1, 1), (CONTEXT - 3, 3), (2, CONTEXT - 2), (CONTEXT // 2, CONTEXT // 2)]]
    seqs = [make_seq(tok, p, m) for p, m in jobs]
    run_staggered(sched, seqs, join_every=3)
    for (prompt, max_tokens), s in zip(jobs, seqs):
        assert s.tokens == generate(model, [prompt], max_tokens)[0]


def test_unknown_decode_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown decode mode 'compiled' for serving"):
        setup(decode="compiled")


def test_window_is_compacted_after_a_long_row_leaves(monkeypatch):
    """The torch fast step's window: a long prompt pushes the shared cursor far right; once it leaves, the
    short rows move back left (every step attends over all slots before the cursor) and still produce the
    engine's tokens."""
    torch_fast_step(monkeypatch)
    torch.manual_seed(0)
    model = TransformerLM(get_preset("llama-tiny", vocab_size=259, d_model=64, n_layers=2, max_seq_len=200,
                                     init_std=0.5)).eval()
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    sched = Scheduler(model, max_batch=4, decode="fast")
    g = torch.Generator().manual_seed(9)
    long = make_seq(tok, torch.randint(0, 256, (120,), generator=g).tolist(), 2)
    short = [make_seq(tok, torch.randint(0, 256, (4,), generator=g).tolist(), 60) for _ in range(2)]
    sched.submit([long, *short])
    widths = []
    while sched.rows or sched.waiting:
        sched.step()
        widths.append(sched.slots.cursor)
    assert max(widths) >= 120 and widths[-1] < 100 and sched.slots.shifts["left"] >= 1
    for s in [long, *short]:
        assert s.tokens == generate(model, [s.prompt], s.max_tokens)[0]
