"""Prompts joining the running batch: prefilled straight into their block tables, a chunk at a time.

A Joiner is one distinct prompt (the n choices of a prompt share it) from admission until its K/V are all in
its block table. Its table starts with the prompt's cached prefix (the prefix cache's blocks, shared), and
every scheduler step gives the joiners at most `budget` prompt tokens in all (first come, first served; the
last one served may get only part of what it needs), so a long prompt is prefilled over several steps while
the running rows keep decoding between them (chunked prefill).

    chunks    this step's chunks go through generate's own prefill (generate/prefill.py: "model", or "bf16"
              through a bf16 copy) on a PagedKVCache view of the joiners' tables: rows of different cached
              lengths and chunk sizes in one forward, each chunk right-aligned (nn/paged_kv_cache.py), in
              groups whose padding is at most PAD_WASTE of the real tokens
    native    a group of chunks of one size, at most CHUNK_MAX_ROWS tokens in all (a prefix-cache hit leaves a few),
              in "model" mode runs through the decode step's C++ step when it has one (FastDecoder.paged):
              straight on the tables' blocks, each row over its own cached length. When every matrix is in
              ggml blocks (FastDecoder.prompt_gemm) the other chunks take that step too, each in pieces of
              PROMPT_CHUNK_MAX_ROWS tokens: its GEMMs are the forward's without the forward's widened tiles past
              512 rows or its per-token last layer (generate/prefill.py's long prompts; 1B Q4_K_M 1024 tokens
              80 -> 228 tok/s there)
    scored    echo + logprobs needs the logits of every prompt position: the prompt alone, its chunks with
              logits_to_keep=0 (so the (T, V) logits stay bounded), no cache reuse
A joiner whose last chunk ran has the logits of its last position (token 1 of every choice) and offers its
full blocks to the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.generate.prefill import CHUNK_MAX_ROWS, PROMPT_CHUNK_MAX_ROWS, prefill
from scratchlm.model import TransformerLM
from scratchlm.nn.paged_kv_cache import BlockTable, PagedKVCache
from scratchlm.serve.kv_space import KVSpace
from scratchlm.serve.sequence import LogprobInfo, Sequence
from scratchlm.serve.token_choice import logprob_infos

PAD_WASTE = 1.0  # a group's padded tokens may be at most this fraction of its real ones
NATIVE_STEP_TOKENS = 2 * CHUNK_MAX_ROWS  # prompt tokens per scheduler step the C++ step takes, in sets of one size


@dataclass(eq=False)
class Joiner:
    """A distinct prompt on its way into the batch, and the sequences (choices) waiting for it."""

    ids: list[int]  # the tokens its table must hold: the prompt (+ the tokens generated before a preemption)
    seqs: list[Sequence]
    table: BlockTable
    cached: int = 0  # tokens whose K/V came from the prefix cache
    top_n: int | None = None  # echo + logprobs: the most alternatives a choice wants per prompt token
    resumed: bool = False  # a preempted sequence coming back: its next token is chosen already
    logits: torch.Tensor | None = None  # (V,) of the last position, once done
    prompt_logprobs: list[LogprobInfo | None] = field(default_factory=lambda: [None])

    @property
    def remaining(self) -> int:
        return len(self.ids) - self.table.length

    @property
    def done(self) -> bool:
        return self.remaining == 0


def _groups(chunks: list[tuple[Joiner, int]]) -> list[list[tuple[Joiner, int]]]:
    """Chunks sorted by size, grouped so each group's padding stays within PAD_WASTE of its real tokens."""
    out: list[list[tuple[Joiner, int]]] = []
    for item in sorted(chunks, key=lambda c: -c[1]):
        group = out[-1] if out else None
        if group is not None:
            width, real = group[0][1], sum(n for _, n in group) + item[1]
            if width * (len(group) + 1) - real <= PAD_WASTE * real:
                group.append(item)
                continue
        out.append([item])
    return out


def _native_sets(chunks: list[tuple[Joiner, int]]) -> tuple[list[list[tuple[Joiner, int]]], list[tuple[Joiner, int]]]:
    """Split chunks into sets of one size for the C++ step (each at most CHUNK_MAX_ROWS tokens, at most
    NATIVE_STEP_TOKENS in all, smallest sizes first) and the rest for the forward. A C++ step costs about the
    same per token as the forward's GEMMs but has no padding and no fixed cost (the forward widens every
    block tile once per call: ~0.1 s on SmolLM2): a wave of prompts that mostly hit the prefix cache (chunks
    of 1 to ~20 tokens) padded to its longest chunk computed up to 2x its tokens."""
    by_size: dict[int, list[tuple[Joiner, int]]] = {}
    for j, n in chunks:
        by_size.setdefault(n, []).append((j, n))
    native: list[list[tuple[Joiner, int]]] = []
    rest: list[tuple[Joiner, int]] = []
    room = NATIVE_STEP_TOKENS
    for n in sorted(by_size):
        items = by_size[n]
        if n * len(items) <= min(CHUNK_MAX_ROWS, room):
            native.append(items)
            room -= n * len(items)
        else:
            rest += items
    return native, rest


def _run_group(model: TransformerLM, space: KVSpace, group: list[tuple[Joiner, int]], mode: str) -> None:
    """One forward for a group of chunks: joiner j gets its next n_j tokens, right-aligned in width T."""
    t = group[0][1]
    view = PagedKVCache(space.pool, [j.table for j, _ in group]).expect(t, [n for _, n in group])
    ids = torch.zeros(len(group), t, dtype=torch.long)
    positions = torch.zeros(len(group), t, dtype=torch.long)
    for row, (j, n) in enumerate(group):
        start = j.table.length
        ids[row, t - n:] = torch.tensor(j.ids[start : start + n])
        positions[row, t - n:] = torch.arange(start, start + n)
    dev = space.pool.k.device
    logits = prefill(model, ids.to(dev), positions.to(dev), view.key_mask(), view, mode)  # (J, V)
    for row, (j, _) in enumerate(group):
        if j.done:
            j.logits = logits[row]


def _run_native(space: KVSpace, decoder: FastDecoder, group: list[tuple[Joiner, int]]) -> None:
    """Chunks of one size n through the decode step's C++ step, straight on the tables' blocks (their stored
    K/V read in place, the chunks' written there)."""
    n, dev = group[0][1], space.pool.k.device
    starts = [j.table.length for j, _ in group]
    ids = torch.tensor([j.ids[s : s + n] for (j, _), s in zip(group, starts)], device=dev)  # (J, n)
    positions = torch.tensor([list(range(s, s + n)) for s in starts], device=dev)
    logits = decoder.paged(ids, positions, space.pool, [j.table for j, _ in group])  # (J, V)
    for row, (j, _) in enumerate(group):
        if j.done:
            j.logits = logits[row]


def _run_scored(model: TransformerLM, space: KVSpace, j: Joiner, n: int) -> None:
    """The next n prompt tokens of an echo + logprobs joiner, with the logprobs of every position."""
    start = j.table.length
    view = PagedKVCache(space.pool, [j.table]).expect(n)
    dev = space.pool.k.device
    ids = torch.tensor([j.ids], device=dev)
    logits = model(ids[:, start : start + n], torch.arange(start, start + n, device=dev)[None], None, view)[0]
    nxt = ids[0, start + 1 : start + n + 1]  # the token each position predicts (none after the last)
    if nxt.numel():
        j.prompt_logprobs += logprob_infos(logits[: nxt.shape[0]], nxt, j.top_n)
    if j.done:
        j.logits = logits[-1]


def prefill_step(model: TransformerLM, space: KVSpace, joiners: list[Joiner], budget: int, mode: str,
                 decoder: FastDecoder | None = None) -> None:
    """Give the joiners, in order, at most `budget` prompt tokens of prefill this step (at least one chunk).
    decoder: the decode step's FastDecoder with a C++ step (decode_step.chunk_decoder), which runs a group of
    short chunks of one size (at most CHUNK_MAX_ROWS tokens in all, "model" mode) without the forward's torch
    dispatch."""
    chunks: list[tuple[Joiner, int]] = []
    for j in joiners:
        if budget <= 0:
            break
        n = min(j.remaining, budget)
        budget -= n
        if j.top_n is not None:
            _run_scored(model, space, j, n)
        else:
            chunks.append((j, n))
    cpp = decoder is not None and mode == "model"  # the C++ step computes this prefill
    native, rest = _native_sets(chunks) if cpp else ([], chunks)
    for group in native:
        _run_native(space, decoder, group)
    for group in _groups(rest):  # what the sets left (past NATIVE_STEP_TOKENS, or a set past CHUNK_MAX_ROWS)
        sizes = {n for _, n in group}
        if cpp and len(sizes) == 1 and len(group) * group[0][1] <= CHUNK_MAX_ROWS:
            _run_native(space, decoder, group)
        elif cpp and decoder.prompt_gemm:
            for j, n in group:
                for done in range(0, n, PROMPT_CHUNK_MAX_ROWS):
                    _run_native(space, decoder, [(j, min(PROMPT_CHUNK_MAX_ROWS, n - done))])
        else:
            _run_group(model, space, group, mode)
    for j in joiners:
        if j.done and not j.resumed:
            space.offer(j.ids, j.table)
