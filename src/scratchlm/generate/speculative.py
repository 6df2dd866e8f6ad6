"""Speculative decoding: draft k tokens cheaply, check them with one forward of the model, keep what it agrees with.

Drafts (Speculation.method):
    "ngram"  prompt lookup: the tokens that followed the most recent earlier occurrence of the sequence's last
             n tokens (n = ngram .. 1, longest first); free, and good wherever the output repeats its input
             (code edits, summaries, quoting). A deterministic draft: q(d) = 1.
    "draft"  a small draft model sharing the tokenizer proposes k tokens autoregressively (draws from its own
             processed distribution q, or greedy), on its own KV cache.
Verification: the model runs [last, d_1 .. d_k] at positions n .. n+k in one forward (generate/packed_forward.py
on the fast decoder's weights, or the model's forward), giving p_0 .. p_k (each processed as plain decoding
processes logits: penalties, temperature, top-k/p, min-p). Then, for i = 1 .. k (Leviathan et al. 2023):
    greedy     accept d_i while d_i = argmax p_{i-1}; the first mismatch emits argmax p_{i-1} instead
    sampling   accept d_i with probability min(1, p_{i-1}(d_i) / q_i(d_i)); on the first rejection emit a draw
               from norm(max(0, p_{i-1} - q_i)) and stop
and when every draft is accepted, emit a bonus draw from p_k. Each emitted token is distributed exactly as
plain decoding's (P(emit x) = q(x) min(1, p/q) + (1 - sum_y min(p, q)) max(0, p - q)(x) / sum max(0, p - q)
= p(x)), so greedy outputs are plain decoding's and sampled ones follow the same distribution (tested on a toy
vocabulary). The cache then keeps [last, accepted drafts] and drops the rest (its length rolls back).
Draft length (Speculation.adaptive, default on): a sequence starts at k; after a verification that accepted
every draft the next draft may be 2 longer (up to k), after a rejection it is 1 shorter (down to 1) — the
schedule of transformers' assisted generation ("heuristic"). A verification costs more per drafted token than
it saves when most are rejected (on CPU a 7-token check costs about two one-token steps).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable

import torch

from scratchlm.generate.decode_step import FAST_MODES, fast_decoder, resolve_decode
from scratchlm.generate.fast_decode import supports
from scratchlm.generate.packed_forward import packed_forward, supported as packed_supported
from scratchlm.generate.prefill import chunk_fits, prefill as run_prefill
from scratchlm.generate.sampling import (SamplingParams, choose_next_token, make_generator, process_logits,
                                         token_counts)
from scratchlm.model import TransformerLM
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.softmax import softmax

SPEC_METHODS = ("ngram", "draft")
Forward = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", KVCache, int], torch.Tensor]


@dataclass(frozen=True)
class Speculation:
    """How to draft: method "ngram" (prompt lookup, suffixes of up to `ngram` tokens) or "draft" (`draft_model`,
    sharing the tokenizer); k tokens drafted per forward of the model."""

    method: str = "ngram"
    k: int = 4
    ngram: int = 3
    draft_model: TransformerLM | None = None
    adaptive: bool = True  # draft lengths follow the acceptances (next_len); False: always k

    def next_len(self, current: int, drafted: int, accepted: int) -> int:
        """The next draft length of a sequence after a verification of `drafted` tokens that accepted
        `accepted`: +2 (at most k) when all were accepted, -1 (at least 1) after a rejection, else unchanged."""
        if not self.adaptive or drafted == 0:
            return current if self.adaptive else self.k
        return min(self.k, current + 2) if accepted == drafted else max(1, current - 1)

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"unknown speculation method {self.method!r}; valid: {SPEC_METHODS}")
        if not 1 <= self.k <= 32:
            raise ValueError(f"Speculation.k={self.k} must be in [1, 32] draft tokens per step")
        if self.ngram < 1:
            raise ValueError(f"Speculation.ngram={self.ngram} must be >= 1")
        if (self.method == "draft") != (self.draft_model is not None):
            raise ValueError("method 'draft' needs a draft_model (and only it takes one)")


def ngram_draft(tokens: list[int], k: int, n_max: int = 3) -> list[int]:
    """Prompt lookup: the up to k tokens after the latest earlier occurrence of tokens' last n tokens, for the
    longest n <= n_max that occurs; [] when none does."""
    for n in range(min(n_max, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest first, never the suffix itself
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def _bump(counts: torch.Tensor | None, token: int) -> None:
    if counts is not None:
        counts[0, token] += 1


def accept_draft(logits: torch.Tensor, draft: list[int], q: torch.Tensor | None, params: SamplingParams,
                 counts: torch.Tensor | None = None, generator: torch.Generator | None = None) -> list[int]:
    """The tokens to emit after verifying `draft` (k tokens): logits (>= k + 1, V) of the model at [last, d_1..d_k],
    q (k, V) the draft distributions (None: deterministic drafts, q_i = one-hot d_i), counts (1, V) the
    penalties' token counts so far (updated with the emitted tokens). Returns the accepted drafts + 1 token."""
    out: list[int] = []
    for i in range(len(draft) + 1):
        processed = process_logits(logits[i : i + 1].float(), params, counts)  # (1, V)
        if params.greedy:
            token = int(torch.argmax(processed, dim=-1))
            out.append(token)
            _bump(counts, token)
            if i == len(draft) or token != draft[i]:
                return out
            continue
        p = softmax(processed, dim=-1)[0]  # (V,)
        if i == len(draft):  # every draft accepted: the bonus token
            token = int(torch.multinomial(p, 1, generator=generator))
        else:
            d = draft[i]
            q_d = 1.0 if q is None else float(q[i, d])
            if float(torch.rand(1, generator=generator)) * q_d < float(p[d]):  # accept w.p. min(1, p(d) / q(d))
                out.append(d)
                _bump(counts, d)
                continue
            residual = p.clone()
            if q is None:
                residual[d] = 0.0  # max(0, p - onehot(d))
            else:
                residual = (p - q[i].to(p.dtype)).clamp(min=0)
            total = float(residual.sum())
            token = int(torch.multinomial(residual / total if total > 0 else p, 1, generator=generator))
        out.append(token)
        _bump(counts, token)
        return out
    return out


def forward_fn(model: TransformerLM, decode: str = "auto") -> Forward:
    """(ids (B, T), positions, key mask, cache, keep) -> logits (B, keep or T, V): for the fast decode modes the
    decode step's C++ chunk with every token's logits where it fits (a contiguous fp32 cache, at most
    CHUNK_MAX_ROWS tokens: a verification of k drafts), else the packed fast forward
    (generate/packed_forward.py); the model's own forward for "model" or what neither can do."""
    mode = resolve_decode(model, decode)
    if mode in FAST_MODES and supports(model.config):
        dec = fast_decoder(model, FAST_MODES[mode])
        if packed_supported(dec):
            def fast(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, cache: KVCache,
                     keep: int) -> torch.Tensor:
                if chunk_fits(dec, ids, mask, cache, "model"):
                    logits = dec.chunk(ids, pos, mask, cache, all_logits=keep != 1)  # (B, T, V) or (B, V)
                    return logits[:, None] if keep == 1 else logits[:, -keep:]
                return packed_forward(dec, ids, pos, mask, cache, keep)
            return fast
    return lambda ids, pos, mask, cache, keep: model(ids, pos, mask, cache, logits_to_keep=keep)


class DraftRunner:
    """A draft model on its own KV cache (one sequence): propose(tokens, k) catches its cache up with `tokens`
    (rolling back what was rejected), then drafts k tokens (greedy, or drawn from its processed distribution)."""

    def __init__(self, draft: TransformerLM, max_len: int, decode: str = "auto") -> None:
        self.model, self.forward = draft.eval(), forward_fn(draft, decode)
        self.cache = draft.new_kv_cache(1, max_seq_len=max_len)
        self.fed: list[int] = []  # the tokens whose K/V the cache holds

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, params: SamplingParams, counts: torch.Tensor | None,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        common = 0
        limit = min(len(self.fed), len(tokens) - 1)  # the last token is always fed again: its logits draft d_1
        while common < limit and self.fed[common] == tokens[common]:
            common += 1
        self.cache.seq_len = common
        dev = self.cache.k.device
        new = tokens[common:]
        logits = self.forward(torch.tensor([new], device=dev), torch.arange(common, len(tokens), device=dev)[None],
                              None, self.cache, 1)[:, -1]  # (1, V)
        counts = None if counts is None else counts.clone()
        drafts, qs = [], []
        for i in range(k):
            processed = process_logits(logits.float(), params, counts)
            if params.greedy:
                d = int(torch.argmax(processed, dim=-1))
            else:
                q = softmax(processed, dim=-1)[0]
                d = int(torch.multinomial(q, 1, generator=generator))
                qs.append(q)
            drafts.append(d)
            _bump(counts, d)
            if i < k - 1:
                pos = torch.tensor([[len(tokens) + i]], device=dev)
                logits = self.forward(torch.tensor([[d]], device=dev), pos, None, self.cache, 1)[:, -1]
        self.fed = tokens + drafts[:-1]
        return drafts, (torch.stack(qs) if qs else None)


@torch.inference_mode()
def iter_speculative(model: TransformerLM, prompt: list[int], max_new_tokens: int, params: SamplingParams,
                     spec: Speculation, seed: int | None = None, decode: str = "auto",
                     prefill: str = "model") -> Iterator[list[int]]:
    """Generate up to max_new_tokens for one prompt, yielding the tokens of each model forward (1 .. k + 1)."""
    dev = model.device
    total = len(prompt) + max_new_tokens  # every verified position is below it
    cache = model.new_kv_cache(1, max_seq_len=total)
    forward = forward_fn(model, decode)
    generator = make_generator(seed, dev)
    ids = torch.tensor([prompt], device=dev)
    counts = token_counts(ids, model.config.vocab_size) if params.uses_counts else None  # as the engine counts
    logits = run_prefill(model, ids, torch.arange(len(prompt), device=dev)[None], None, cache, prefill)  # (1, V)
    first = int(choose_next_token(logits, params, counts, generator)[0])
    _bump(counts, first)
    tokens = list(prompt) + [first]
    yield [first]
    drafter = DraftRunner(spec.draft_model, total, decode) if spec.method == "draft" else None
    made, k_next = 1, spec.k
    while made < max_new_tokens:
        k = min(k_next, max_new_tokens - made - 1)
        q = None
        if k <= 0:
            draft = []
        elif drafter is not None:
            draft, q = drafter.propose(tokens, k, params, counts, generator)
        else:
            draft = ngram_draft(tokens, k, spec.ngram)
        n = len(tokens) - 1  # cache length: everything but the last token
        step = torch.tensor([[tokens[-1]] + draft], device=dev)
        logits = forward(step, torch.arange(n, n + step.shape[1], device=dev)[None], None, cache, 0)[0]
        out = accept_draft(logits, draft, q, params, counts, generator)
        k_next = spec.next_len(k_next, len(draft), len(out) - 1)
        cache.seq_len = n + len(out)  # keep [last, accepted drafts]; the rest is overwritten later
        tokens += out
        made += len(out)
        yield out
