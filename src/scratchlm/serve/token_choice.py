"""Choosing the next token of every row of a batch step: constraint masks, samplers, logprobs.

Per row i with logits l_i (V,):
    constrained rows:  l_i[t] = -inf for every token t the row's constraint forbids (structured output)
    greedy rows without penalties share one argmax; the others go through `choose_next_token` with
    their own params, counts and seeded generator
    logprobs:          log p(t) = log_softmax(l_i)[t] of the *model's* logits (before masks, penalties and
                       temperature, as OpenAI and vLLM report them), plus the top-k (id, log p) pairs
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from scratchlm.generate.sampling import choose_next_token
from scratchlm.nn.softmax import log_softmax
from scratchlm.serve.sequence import LogprobInfo, Sequence


def logprob_infos(logits: torch.Tensor, tokens: torch.Tensor, top_n: int) -> list[LogprobInfo]:
    """logits (T, V), tokens (T,) -> per row (log p(tokens[t]), top_n (id, log p) by decreasing log p)."""
    lsm = log_softmax(logits.float(), dim=-1)  # (T, V)
    chosen = lsm.gather(1, tokens[:, None].to(lsm.device))[:, 0].tolist()
    if top_n > 0:
        top = torch.topk(lsm, min(top_n, lsm.shape[-1]), dim=-1)
        pairs = [tuple(zip(i, v)) for i, v in zip(top.indices.tolist(), top.values.tolist())]
    else:
        pairs = [() for _ in chosen]
    return list(zip(chosen, pairs))


def apply_constraints(logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
    """A copy of logits (k, V) with every constrained row's forbidden tokens at -inf (the input when none):
    the rows' cached masks stacked and applied in one op."""
    rows = [i for i, s in enumerate(seqs) if s.constraint is not None]
    if not rows:
        return logits
    allowed = torch.stack([seqs[i].constraint.allowed(seqs[i].max_tokens - len(seqs[i].tokens) - 1)
                           for i in rows]).to(logits.device)  # (c, V) bool
    if len(rows) == logits.shape[0]:
        return torch.where(allowed, logits, float("-inf"))
    out = logits.clone()
    out[rows] = torch.where(allowed, logits[rows], float("-inf"))
    return out


def choose_tokens(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[tuple[int, LogprobInfo | None]]:
    """The next token of each row of logits (k, V) and, for rows that want them, its logprobs."""
    masked = apply_constraints(logits, seqs)
    plain = [i for i, s in enumerate(seqs) if s.params.greedy and not s.params.uses_counts]
    chosen: dict[int, int] = {}
    if plain:
        rows = masked if len(plain) == len(seqs) else masked[plain]  # all rows plain greedy: no gather copy
        chosen.update(zip(plain, torch.argmax(rows, dim=-1).tolist()))
    for i, s in enumerate(seqs):
        if i not in chosen:
            chosen[i] = int(choose_next_token(masked[i : i + 1], s.params, s.counts, s.generator)[0])
    infos: dict[int, LogprobInfo] = {}
    want = [i for i, s in enumerate(seqs) if s.top_logprobs is not None]
    if want:
        top_n = max(seqs[i].top_logprobs for i in want)
        rows = logprob_infos(logits[want], torch.tensor([chosen[i] for i in want]), top_n)
        for i, (lp, top) in zip(want, rows):
            infos[i] = (lp, top[: seqs[i].top_logprobs])
    return [(chosen[i], infos.get(i)) for i in range(len(seqs))]
