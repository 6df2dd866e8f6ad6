"""Speculative decoding in the server (`--speculative ngram|draft`): every running row drafts up to k tokens,
one forward over the rows' block tables checks them all, each row keeps what the model agrees with.

Per step (generate/speculative.py has the math):
    draft    rows without a constraint or logprobs draft k_b <= k tokens: prompt lookup over their prompt and
             reply ("ngram"), or the draft model ("draft": its own block pool and tables, one forward to catch
             up with the accepted tokens, then k - 1 one-token steps, all rows batched; the draft's C++ step on
             its tables where it has one, except a long catch-up); other rows draft none
    verify   one forward of [last, d_1 .. d_k_b] for every row: the C++ step on the block tables with every
             token's logits (FastDecoder.paged, one call per feed length) where the decode mode has it; else
             ragged, right-aligned on a PagedKVCache view (the packed fast weights through
             generate/packed_forward.py, or the model's forward for decode="model")
    accept   rows with drafts: accept_draft (greedy: the model's own argmax tokens; sampling: exact rejection
             sampling, so the reply follows plain decoding's distribution); rows without: the usual choice
             (constraints, logprobs: serve/token_choice.py)
    trim     a row's table keeps [last, accepted drafts]; the rejected positions are overwritten later
The scheduler then pushes each row's tokens in order, stopping where a stop rule ends the row.
"""

from __future__ import annotations

import torch

from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.generate.prefill import CHUNK_MAX_ROWS
from scratchlm.generate.sampling import process_logits
from scratchlm.generate.speculative import Speculation, accept_draft, forward_fn, ngram_draft
from scratchlm.model import TransformerLM
from scratchlm.nn.paged_kv_cache import BlockTable, PagedKVCache
from scratchlm.nn.softmax import softmax
from scratchlm.serve.batch_rows import CountedRows, pool_decoder
from scratchlm.serve.kv_space import KVSpace
from scratchlm.serve.sequence import LogprobInfo, Sequence
from scratchlm.serve.token_choice import choose_tokens

Emitted = list[tuple[int, "LogprobInfo | None"]]


def _ragged_forward(forward, space: KVSpace, tables: list[BlockTable], rows: list[list[int]], starts: list[int],
                    keep: int) -> torch.Tensor:
    """rows[b] (ragged) fed at positions starts[b].. into tables[b], right-aligned: logits (B, keep or T, V)."""
    t = max(len(r) for r in rows)
    view = PagedKVCache(space.pool, tables).expect(t, [len(r) for r in rows])
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    positions = torch.zeros(len(rows), t, dtype=torch.long)
    for b, (r, start) in enumerate(zip(rows, starts)):
        ids[b, t - len(r):] = torch.tensor(r)
        positions[b, t - len(r):] = torch.arange(start, start + len(r))
    dev = space.pool.k.device
    return forward(ids.to(dev), positions.to(dev), view.key_mask(), view, keep)


def _native_rows(dec: FastDecoder, space: KVSpace, tables: list[BlockTable], rows: list[list[int]],
                 starts: list[int], all_logits: bool = True) -> list[torch.Tensor]:
    """rows[b] fed at positions starts[b].. into tables[b] through the C++ step, rows of one length per call:
    every row's logits (len(rows[b]), V), or its last token's (V,) without all_logits."""
    out: list[torch.Tensor | None] = [None] * len(rows)
    by_len: dict[int, list[int]] = {}
    for b, r in enumerate(rows):
        by_len.setdefault(len(r), []).append(b)
    for n, members in by_len.items():
        ids = torch.tensor([rows[b] for b in members], dtype=torch.long)
        positions = torch.tensor([list(range(starts[b], starts[b] + n)) for b in members], dtype=torch.long)
        logits = dec.paged(ids, positions, space.pool, [tables[b] for b in members], all_logits)  # (J, [n,] V)
        for i, b in enumerate(members):
            out[b] = logits[i]
    return out


class DraftModelRows:
    """The draft model's K/V for the running rows: its own pool, a table per row (seq.draft_kv) holding the
    tokens in seq.draft_fed."""

    def __init__(self, draft: TransformerLM, blocks: int, decode: str) -> None:
        self.model = draft.eval()
        self.space = KVSpace(draft, blocks)
        self.forward = forward_fn(draft, decode)
        self.native = pool_decoder(draft, decode, self.space)

    def _last_logits(self, tables: list[BlockTable], feeds: list[list[int]], starts: list[int]) -> torch.Tensor:
        """The last token's logits (n, V) of every feed: the draft's C++ step for short feeds (the one-token
        steps, a catch-up of a few tokens), its ragged forward for a long catch-up (a new row's prompt)."""
        if self.native is not None and max(map(len, feeds)) <= CHUNK_MAX_ROWS:
            return torch.stack(_native_rows(self.native, self.space, tables, feeds, starts, all_logits=False))
        return _ragged_forward(self.forward, self.space, tables, feeds, starts, 1)[:, -1]

    def release(self, seq: Sequence) -> None:
        if seq.draft_kv is not None:
            self.space.release(seq.draft_kv)
            seq.draft_kv, seq.draft_fed = None, []

    def propose(self, rows: list[Sequence], ks: list[int]) -> list[tuple[list[int], torch.Tensor | None]]:
        """Up to ks[b] draft tokens (and their distributions q when sampled) per row; rows whose tables cannot
        grow draft none."""
        out: list[tuple[list[int], torch.Tensor | None]] = [([], None)] * len(rows)
        live, feeds, starts = [], [], []
        for b, (s, k) in enumerate(zip(rows, ks)):
            if k <= 0:
                continue
            tokens = s.prompt + s.tokens
            if s.draft_kv is None:
                s.draft_kv, s.draft_fed = BlockTable(), []
            common, limit = 0, min(len(s.draft_fed), len(tokens) - 1)
            while common < limit and s.draft_fed[common] == tokens[common]:
                common += 1
            s.draft_kv.length = common  # roll back what was rejected
            if not self.space.grow(s.draft_kv, len(tokens) - common + k - 1):
                continue
            live.append(b)
            feeds.append(tokens[common:])
            starts.append(common)
        if not live:
            return out
        members = [rows[b] for b in live]
        want = [ks[b] for b in live]
        logits = self._last_logits([s.draft_kv for s in members], feeds, starts)
        counts = [None if s.counts is None else s.counts.clone() for s in members]
        drafts: list[list[int]] = [[] for _ in live]
        qs: list[list[torch.Tensor]] = [[] for _ in live]
        active = list(range(len(live)))
        for i in range(max(want)):
            for j in active:  # draw d_{i+1} of every active row from its draft distribution
                s = members[j]
                processed = process_logits(logits[j : j + 1].float(), s.params, counts[j])
                if s.params.greedy:
                    d = int(torch.argmax(processed, dim=-1))
                else:
                    q = softmax(processed, dim=-1)[0]
                    d = int(torch.multinomial(q, 1, generator=s.generator))
                    qs[j].append(q)
                drafts[j].append(d)
                if counts[j] is not None:
                    counts[j][0, d] += 1
            active = [j for j in active if len(drafts[j]) < want[j]]
            if not active:
                break
            positions = [len(members[j].prompt) + len(members[j].tokens) + i for j in active]  # where d_{i+1} goes
            step = self._last_logits([members[j].draft_kv for j in active], [[drafts[j][-1]] for j in active],
                                     positions)
            logits = logits.clone()
            logits[active] = step
        for j, (b, s) in enumerate(zip(live, members)):
            s.draft_fed = s.prompt + s.tokens + drafts[j][:-1]
            out[b] = (drafts[j], torch.stack(qs[j]) if qs[j] else None)
        return out


class SpeculativeRows(CountedRows):
    """The running rows decoded with drafts over their block tables (see the module docstring)."""

    def __init__(self, model: TransformerLM, space: KVSpace, spec: Speculation, decode: str, context: int,
                 draft_blocks: int = 0) -> None:
        self.space, self.spec, self.context = space, spec, context
        self.forward = forward_fn(model, decode)
        self.native = pool_decoder(model, decode, space)
        self.draft = None if spec.method != "draft" else DraftModelRows(spec.draft_model, draft_blocks, decode)
        self.count = 0
        self.drafted = self.accepted = 0  # draft tokens proposed / accepted so far (for /health)

    @property
    def nbytes(self) -> int:
        return 0

    def release(self, seq: Sequence) -> None:
        if self.draft is not None:
            self.draft.release(seq)

    def drafts(self, rows: list[Sequence]) -> list[tuple[list[int], torch.Tensor | None]]:
        """Each row's draft tokens (none for rows with a constraint or logprobs, or at the end of their budget)."""
        ks = []
        for s in rows:
            left = min(s.max_tokens - len(s.tokens), self.context - len(s.prompt) - len(s.tokens)) - 1
            ok = s.constraint is None and s.top_logprobs is None
            want = self.spec.k if s.draft_len is None else s.draft_len
            ks.append(max(0, min(want, left)) if ok else 0)
        if self.draft is not None:
            return self.draft.propose(rows, ks)
        return [(ngram_draft(s.prompt + s.tokens, k, self.spec.ngram) if k else [], None) for s, k in zip(rows, ks)]

    def decode(self, rows: list[Sequence], drafts: list[tuple[list[int], torch.Tensor | None]]) -> list[Emitted]:
        """Verify every row's drafts in one forward; the tokens each row emits (with logprob info for the rows
        that chose the usual way). Each row's table must have room for its last token + its drafts."""
        feeds = [[s.tokens[-1]] + d for s, (d, _) in zip(rows, drafts)]
        starts = [s.last_position for s in rows]
        before = [s.kv.length for s in rows]
        tables = [s.kv for s in rows]
        if self.native is not None:  # per row (len(feed), V)
            logits = _native_rows(self.native, self.space, tables, feeds, starts)
        else:
            logits = _ragged_forward(self.forward, self.space, tables, feeds, starts, 0)  # (n, T, V)
        out: list[Emitted] = [[] for _ in rows]
        plain = [b for b, (d, _) in enumerate(drafts) if not d]
        if plain:
            chosen = choose_tokens(torch.stack([logits[b][-1] for b in plain]), [rows[b] for b in plain])
            for b, pick in zip(plain, chosen):
                out[b] = [pick]
        for b, (s, (d, q)) in enumerate(zip(rows, drafts)):
            if d:
                counts = None if s.counts is None else s.counts.clone()  # the row's push counts what it emits
                tokens = accept_draft(logits[b][-len(d) - 1:], d, q, s.params, counts, s.generator)
                out[b] = [(t, None) for t in tokens]
                self.drafted += len(d)
                self.accepted += len(tokens) - 1
                s.draft_len = self.spec.next_len(self.spec.k if s.draft_len is None else s.draft_len, len(d),
                                                 len(tokens) - 1)
            s.kv.length = before[b] + len(out[b])  # keep [last, accepted drafts]
        return out
