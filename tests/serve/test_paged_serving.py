"""The scheduler on paged K/V memory, against the definition (the model's full forward) and the engine.

    - every decode step's logits, for every row of a ragged batch that changes as rows join and leave, equal the
      row's own full forward, on the reference decode (attention over block tables) and the packed fast step
      (its window written through to the blocks; rows spread over one or several windows), with and without
      sliding windows shorter than the rows; at the end each row's blocks hold exactly the K/V a contiguous
      cache holds for its tokens
    - a pool too small for the batch: rows are preempted (their blocks freed, prefilled again later) and every
      greedy and seeded output still equals the engine's; the pool is never overdrawn
    - admission waits while the pool is full (the queue grows, nothing fails), then 429 beyond --max-queue
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.generate import generate
from scratchlm.generate.sampling import SamplingParams
from scratchlm.model import TransformerLM
from scratchlm.serve.batch_rows import NativeRows, PagedRows, StagedRows
from scratchlm.serve.scheduler import QueueFull, Scheduler
from scratchlm.serve.sequence import Sequence
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

CONTEXT = 64
TOL = dict(rtol=1e-4, atol=1e-4)
TOK = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)


def model_of(window: int | None = None, std: float = 0.5) -> TransformerLM:
    """A random model; std 0.1 makes one that often continues what came before (drafts get accepted)."""
    torch.manual_seed(0)
    return TransformerLM(get_preset("llama-tiny", vocab_size=259, d_model=64, n_layers=2, n_kv_heads=2,
                                    max_seq_len=CONTEXT, init_std=std, sliding_window=window)).eval()


def make(prompt, max_tokens, params=SamplingParams(), seed=None) -> Sequence:
    return Sequence.create(0, prompt, max_tokens, params, lambda e: None, tokenizer=TOK, vocab_size=259, seed=seed)


def jobs(n: int, seed: int) -> list[tuple[list[int], int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        p = int(torch.randint(1, 30, (1,), generator=g))
        out.append((torch.randint(0, 256, (p,), generator=g).tolist(), int(torch.randint(1, 25, (1,), generator=g))))
    return out


def drain(sched: Scheduler) -> None:
    while sched.rows or sched.waiting or sched.joiners:
        sched.step()


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("decode", ["model", "fast", "fast-staged", "fast-windows"])
def test_every_step_equals_the_full_forward_and_blocks_hold_the_contiguous_kv(decode, window, monkeypatch):
    """fast: the C++ step on the block tables (NativeRows); fast-staged: the torch fast step on a SlotCache
    window (as without the kernels); fast-windows: any padding opens another window (up to 4)."""
    if decode in ("fast-staged", "fast-windows"):
        monkeypatch.setattr("scratchlm.serve.batch_rows.native_decoder", lambda model, mode: None)
    if decode == "fast-windows":
        monkeypatch.setattr("scratchlm.serve.batch_rows.WASTE_LIMIT", 0)
    model = model_of(window)
    sched = Scheduler(model, max_batch=4, decode=decode.split("-")[0], prefill_chunk=16)
    want = {"model": PagedRows, "fast": NativeRows, "fast-staged": StagedRows, "fast-windows": StagedRows}[decode]
    assert type(sched.rows_impl) is want
    steps: list[tuple[list[list[int]], torch.Tensor]] = []
    decode_rows = sched.rows_impl.decode

    def recording(rows):
        logits = decode_rows(rows)
        steps.append(([s.prompt + s.tokens for s in rows], logits.clone()))
        return logits

    sched.rows_impl.decode = recording
    stored: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
    release = sched._release

    def checking(seq):
        if seq.kv is not None:
            stored.append((seq.prompt + seq.tokens[:-1], *sched.space.pool.read(seq.kv)))
        release(seq)

    sched._release = checking
    seqs = [make(p, m) for p, m in jobs(10, seed=3)]
    for s in seqs:
        sched.submit([s])
        sched.step()
    windows = 0
    while sched.rows or sched.waiting or sched.joiners:
        sched.step()
        windows = max(windows, sum(1 for w in getattr(sched.rows_impl, "owner", []) if w))
    assert windows == {"model": 0, "fast": 0, "fast-staged": 1, "fast-windows": 4}[decode]
    assert sched.stats.max_active == 4 and sched.space.pool.used == 0
    with torch.no_grad():
        for seqs_at_step, logits in steps:
            for row, tokens in enumerate(seqs_at_step):
                torch.testing.assert_close(logits[row], model(torch.tensor([tokens]))[0, -1], **TOL)
        for tokens, k, v in stored:  # (L, KvH, n, Hd) from the blocks vs a contiguous cache of the same tokens
            cache = model.new_kv_cache(1, max_seq_len=len(tokens))
            model(torch.tensor([tokens]), kv_cache=cache)
            torch.testing.assert_close(k, cache.k[:, 0], **TOL)
            torch.testing.assert_close(v, cache.v[:, 0], **TOL)
    assert len(steps) > 20 and len(stored) == 10


@pytest.mark.parametrize("decode", ["model", "fast"])
def test_preempted_rows_resume_with_the_engines_outputs(decode):
    model = model_of()
    sched = Scheduler(model, max_batch=4, decode=decode, kv_blocks=6)  # 96 tokens for 4 rows of up to 54
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.9, top_k=40)
    g = torch.Generator().manual_seed(7)
    work = [(torch.randint(0, 256, (int(torch.randint(2, 20, (1,), generator=g)),), generator=g).tolist(), 34,
             greedy if i % 2 else sampled, 50 + i) for i in range(6)]
    seqs = [make(p, m, params, seed) for p, m, params, seed in work]
    sched.submit(seqs)
    while sched.rows or sched.waiting or sched.joiners:
        sched.step()
        assert sched.space.pool.used <= 6
    assert sched.stats.preempted > 0 and sched.stats.completed == 6 and sched.space.pool.used == 0
    for s, (p, m, params, seed) in zip(seqs, work):
        kw = {} if params.greedy else {"temperature": 0.9, "top_k": 40, "seed": seed}
        assert s.tokens == generate(model, [p], m, **kw)[0]


def test_a_full_pool_queues_then_refuses():
    """Rows are free but the pool is not: the next prompt waits in the queue (FIFO) instead of failing; past
    max_queue waiting sequences, submit raises QueueFull (the server's 429)."""
    model = model_of()
    sched = Scheduler(model, max_batch=4, decode="fast", kv_blocks=4, max_queue=2)
    long = [make(list(range(s, s + 30)), 20) for s in (40, 100)]  # 2 rows x 2 blocks: the whole pool
    sched.submit(long)
    sched.step()
    assert len(sched.rows) == 2 and sched.space.pool.free == 0
    waiting = [make([1, 2, 3], 5), make([4, 5], 5)]
    sched.submit(waiting)
    sched.step()
    assert list(sched.waiting) == waiting and len(sched.rows) == 2  # seats free, blocks not: they wait
    with pytest.raises(QueueFull):
        sched.submit([make([6], 5), make([7], 5), make([8], 5)])
    drain(sched)
    for s in long + waiting:
        assert s.tokens == generate(model, [s.prompt], s.max_tokens)[0]


@pytest.mark.parametrize("decode", ["model", "fast"])
def test_a_long_prompt_is_prefilled_in_chunks_between_decode_steps(decode):
    """prefill_chunk 8: a 45-token prompt arriving while two rows decode is prefilled over 6 steps (8 prompt
    tokens each at most), and every one of those steps still decodes a token for each running row; all outputs
    equal the engine's."""
    model = model_of(6)
    sched = Scheduler(model, max_batch=4, decode=decode, prefill_chunk=8)
    g = torch.Generator().manual_seed(11)
    running = [make(torch.randint(0, 256, (5,), generator=g).tolist(), 30) for _ in range(2)]
    sched.submit(running)
    sched.step()  # both prompts (10 tokens) need 2 steps of 8
    sched.step()
    assert len(sched.rows) == 2
    long = make(torch.randint(0, 256, (45,), generator=g).tolist(), 5)
    sched.submit([long])
    progress = []
    while long not in sched.rows:
        before = [len(s.tokens) for s in running]
        sched.step()
        assert [len(s.tokens) for s in running] == [n + 1 for n in before]  # the streams never stall
        progress.append(long.kv.length if long.kv is not None else sched.joiners[0].table.length)
    assert progress == [8, 16, 24, 32, 40, 46]  # the last step also decoded its token 1 (fed at 45)
    drain(sched)
    for s in running + [long]:
        assert s.tokens == generate(model, [s.prompt], s.max_tokens)[0]


def repetitive_jobs(n: int, seed: int) -> list[tuple[list[int], int]]:
    """Prompts that repeat themselves (prompt lookup finds drafts), ragged."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        text = torch.randint(0, 256, (4 + i % 5,), generator=g).tolist()
        out.append((text * 3, CONTEXT - 3 * len(text) - 1 - i))
    return out


@pytest.mark.parametrize("method,decode", [("ngram", "fast"), ("ngram", "fast-packed"), ("ngram", "model"),
                                           ("draft", "fast")])
def test_speculative_rows_emit_the_engines_greedy_tokens(method, decode, monkeypatch):
    """--speculative: every row drafts (prompt lookup, or a draft model on its own pool), and the drafts are
    verified over the block tables (fast: the C++ step with every token's logits, rows of one feed length per
    call; fast-packed: one ragged packed forward, as without the kernels; model: the model's forward); greedy
    rows emit exactly the engine's plain tokens, a pool too small for the batch still preempts and resumes
    them, and drafts were accepted."""
    from scratchlm.generate.speculative import Speculation

    if decode == "fast-packed":
        monkeypatch.setattr("scratchlm.serve.batch_rows.native_decoder", lambda model, mode: None)
    decode, packed = decode.split("-")[0], decode.endswith("packed")

    model = model_of(6, std=0.1)
    draft = None
    if method == "draft":  # the target with noisy weights: agrees often, not always
        draft = model_of(6, std=0.1)
        with torch.no_grad():
            for w in draft.parameters():
                w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(w.numel())) * 0.03)
    spec = Speculation(method, k=4, draft_model=draft)
    sched = Scheduler(model, max_batch=4, decode=decode, kv_blocks=10, speculation=spec)
    assert (sched.rows_impl.native is not None) == (decode == "fast" and not packed)
    if draft is not None:  # the draft model's one-token steps through its own C++ step too
        assert sched.rows_impl.draft.native is not None
    work = repetitive_jobs(6, seed=13)
    seqs = [make(p, m) for p, m in work]
    for s in seqs:
        sched.submit([s])
        sched.step()
    drain(sched)
    for s, (p, m) in zip(seqs, work):
        assert s.tokens == generate(model, [p], m)[0]
    assert sched.rows_impl.drafted > 0 and sched.stats.decoded_tokens > sched.stats.steps
    assert sched.space.pool.used == 0
    assert 10 < sched.rows_impl.accepted < sched.rows_impl.drafted  # some drafts kept, some rejected
    if draft is not None:
        assert sched.rows_impl.draft.space.pool.used == 0
    else:
        assert sched.stats.preempted > 0


def test_speculation_leaves_constrained_and_logprobs_rows_to_the_usual_choice():
    """A JSON-constrained row and a logprobs row draft nothing; they decode exactly as without speculation,
    beside rows that do speculate."""
    from scratchlm.generate.constrained import GrammarMasks, TokenConstraint, VocabIndex, any_object
    from scratchlm.generate.speculative import Speculation

    model = model_of()
    masks = GrammarMasks(any_object(), VocabIndex([bytes([i]) for i in range(256)] + [None] * 3), [257])
    outputs = []
    for spec in (None, Speculation("ngram", k=3)):
        sched = Scheduler(model, max_batch=4, decode="fast", speculation=spec)
        rows = [make([1, 2, 3] * 4, 20), make([7, 8] * 5, 20)]
        constrained = Sequence.create(0, [123, 34], 30, SamplingParams(), lambda e: None, tokenizer=TOK,
                                      vocab_size=259, constraint=TokenConstraint(masks))
        scored = Sequence.create(0, [5, 6, 5, 6, 5], 12, SamplingParams(), lambda e: None, tokenizer=TOK,
                                 vocab_size=259, top_logprobs=2)
        sched.submit(rows + [constrained, scored])
        drain(sched)
        outputs.append([s.tokens for s in rows + [constrained, scored]])
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("window", [None, 6])
def test_lone_short_chunks_run_the_decode_steps_cpp_chunk(window):
    """With decode "fast" (a C++ step), a lone prompt chunk of at most CHUNK_MAX_ROWS tokens goes through
    FastDecoder.paged on its block table (serve/joining.py); its last logits equal the full forward's, and the
    greedy tokens equal those of the reference scheduler (decode "model", prefill through the forward)."""
    model = model_of(window)
    fast = Scheduler(model, max_batch=2, decode="fast", prefill_chunk=16)
    ref = Scheduler(model, max_batch=2, decode="model", prefill_chunk=16)
    assert ref.chunk_decoder is None and fast.chunk_decoder is not None
    seen = []
    paged = fast.chunk_decoder.paged
    fast.chunk_decoder.paged = lambda *a: seen.append((a[0].shape[1], paged(*a))) or seen[-1][1]
    prompt = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    outs = []
    for sched in (fast, ref):
        seq = make(prompt, 12)
        sched.submit([seq])
        drain(sched)
        outs.append(seq.tokens)
        assert sched.space.pool.used == 0
    # the decode rows call the same object with one token per row; the prompt's two chunks come first
    assert [n for n, _ in seen[:2]] == [16, 4] and all(n == 1 for n, _ in seen[2:]) and len(seen) == 2 + 11
    with torch.no_grad():
        torch.testing.assert_close(seen[1][1][0], model(torch.tensor([prompt]))[0, -1], **TOL)
    assert outs[0] == outs[1]


def prefill_wave(monkeypatch, model, prompts, cached, decoder):
    """The prompts (their first `cached` tokens prefilled first, as a prefix-cache hit leaves them) given to one
    prefill_step with `decoder` (None: the forward alone) -> (space, joiners, the C++ step's (rows, tokens)
    calls, the forward's groups of chunk sizes)."""
    from scratchlm.serve import joining
    from scratchlm.serve.joining import Joiner, prefill_step
    from scratchlm.serve.kv_space import KVSpace

    space = KVSpace(model, 64)
    joiners = []
    for p, c in zip(prompts, cached):
        table = space.start(p)
        assert space.grow(table, len(p))
        if c:
            prefill_step(model, space, [Joiner(p[:c], [], table)], 1000, "model")  # the "cached" part
        joiners.append(Joiner(p, [], table, cached=c))
    native, forward = [], []
    if decoder is not None:
        paged = decoder.paged
        decoder.paged = lambda ids, *a, **kw: native.append(list(ids.shape)) or paged(ids, *a, **kw)
    run_group = joining._run_group
    monkeypatch.setattr(joining, "_run_group",
                        lambda m, s, group, mode: forward.append([n for _, n in group]) or run_group(m, s, group, mode))
    prefill_step(model, space, joiners, 1000, "model", decoder)
    monkeypatch.setattr(joining, "_run_group", run_group)
    return space, joiners, native, forward


def check_wave(model, prompts, run, ref) -> None:
    """Every joiner of run done, its last logits its prompt's full forward, its blocks' K/V those of ref."""
    space, joiners = run[:2]
    ref_space, ref_joiners = ref[:2]
    with torch.no_grad():
        for j, r, p in zip(joiners, ref_joiners, prompts):
            assert j.done and r.done
            torch.testing.assert_close(j.logits, model(torch.tensor([p]))[0, -1], **TOL)
            for mine, theirs in zip(space.pool.read(j.table), ref_space.pool.read(r.table)):
                torch.testing.assert_close(mine, theirs, **TOL)


def test_a_wave_of_mixed_chunks_runs_sets_of_one_size_in_cpp_and_the_rest_in_the_forward(monkeypatch):
    """Prompts arriving together with cached prefixes of different lengths leave chunks of mixed sizes: the
    sets of one size go through the C++ step (smallest first, within NATIVE_STEP_TOKENS), the rest through one
    padded forward. Every joiner's last logits equal its prompt's full forward, and the K/V in its blocks equal
    those of the same wave prefilled by the forward alone."""
    from scratchlm.generate.decode_step import chunk_decoder
    from scratchlm.serve import joining

    model = model_of()
    monkeypatch.setattr(joining, "NATIVE_STEP_TOKENS", 12)
    g = torch.Generator().manual_seed(11)
    cached, sizes = [7, 20, 3, 16, 9, 5], [1, 1, 4, 1, 9, 6]  # sets: 1 x3, 4 -> C++ (7 tokens); 6, 9 -> forward
    prompts = [torch.randint(0, 256, (c + n,), generator=g).tolist() for c, n in zip(cached, sizes)]
    mixed = prefill_wave(monkeypatch, model, prompts, cached, chunk_decoder(model, "fast"))
    ref = prefill_wave(monkeypatch, model, prompts, cached, None)
    assert sorted(mixed[2]) == [[1, 4], [3, 1]] and mixed[3] == [[9, 6]]
    assert ref[2] == [] and sorted(sum(ref[3], [])) == [1, 1, 1, 4, 6, 9]
    check_wave(model, prompts, mixed, ref)


def test_on_blocks_the_chunks_past_the_sets_run_through_the_cpp_step_in_pieces(monkeypatch):
    """A decoder whose matrices are all ggml blocks takes the chunks the sets left through the C++ step too,
    each in pieces of PROMPT_CHUNK_MAX_ROWS tokens on its own row (on top of its cached prefix), not the padded
    forward: every joiner's last logits equal its prompt's full forward and the K/V in its blocks those of the
    same wave prefilled by the forward alone."""
    from scratchlm.generate.decode_step import chunk_decoder
    from scratchlm.serve import joining
    from tests.kernels.test_native_step import on_blocks

    model = on_blocks(model_of())
    monkeypatch.setattr(joining, "NATIVE_STEP_TOKENS", 4)
    monkeypatch.setattr(joining, "PROMPT_CHUNK_MAX_ROWS", 8)
    g = torch.Generator().manual_seed(12)
    cached, sizes = [5, 0, 9], [2, 19, 11]  # the 2 -> a C++ set; 19 -> pieces 8, 8, 3; 11 -> 8, 3
    prompts = [torch.randint(0, 256, (c + n,), generator=g).tolist() for c, n in zip(cached, sizes)]
    decoder = chunk_decoder(model, "fast-gguf")
    assert decoder.prompt_gemm
    pieces = prefill_wave(monkeypatch, model, prompts, cached, decoder)
    ref = prefill_wave(monkeypatch, model, prompts, cached, None)
    assert pieces[3] == [] and sorted(pieces[2]) == sorted([[1, 2], [1, 8], [1, 8], [1, 3], [1, 8], [1, 3]])
    check_wave(model, prompts, pieces, ref)
