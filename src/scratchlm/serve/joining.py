"""Prompts joining the running batch: prefilled into scratch KV caches the scheduler then copies into its rows.

Three ways, chosen per distinct prompt (the n choices of one prompt share its prefill):
    joint      prompts with no cached prefix: one left-padded batch (U, P) through generate's prefill (the
               engine's own code and modes: "model", or "bf16" through a bf16 copy; generate/prefill.py),
               left-padded as the engine pads (see generate/batching.py)
    cached     a prompt whose first h tokens have K/V in the prefix cache: a (1, P) scratch whose slots
               [0, h) are filled from the cache; only tokens h.. go through generate's prefill, at
               positions h..P-1
    scored     echo + logprobs needs the logits of every prompt position: the prompt alone, in chunks of
               CHUNK tokens (logits_to_keep=0 per chunk bounds the (T, V) logits in memory); no cache reuse
Every prefilled prompt's full blocks are then offered to the prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scratchlm.generate.batching import left_pad
from scratchlm.generate.prefill import prefill
from scratchlm.model import TransformerLM
from scratchlm.nn.kv_cache import KVCache
from scratchlm.serve.prefix_cache import PrefixCache
from scratchlm.serve.sequence import LogprobInfo
from scratchlm.serve.token_choice import logprob_infos

CHUNK = 256


@dataclass
class Prefilled:
    """One prompt's prefill: its K/V in row `row` of `cache` (slots [0, width)), its key mask, the logits
    of its last position, how many tokens came from the prefix cache, and (scored) its prompt logprobs."""

    cache: KVCache
    row: int
    width: int
    valid: torch.Tensor  # (width,) bool
    logits: torch.Tensor  # (V,)
    cached: int = 0
    prompt_logprobs: list[LogprobInfo | None] | None = None


def _row_kv(cache: KVCache, row: int, offset: int):
    """kv(start, end) over a scratch row whose tokens start at slot `offset` (for PrefixCache.store)."""
    return lambda a, b: (cache.k[:, row, :, offset + a : offset + b], cache.v[:, row, :, offset + a : offset + b])


def _joint(model: TransformerLM, prompts: list[tuple[int, ...]], pad_id: int, device: torch.device,
           mode: str) -> list[Prefilled]:
    batch = left_pad([list(p) for p in prompts], pad_id, device)
    u, p = batch.ids.shape
    scratch = model.new_kv_cache(u, max_seq_len=p)
    mask = batch.valid if batch.has_padding else None
    logits = prefill(model, batch.ids, batch.positions, mask, scratch, mode)  # (U, V)
    return [Prefilled(scratch, r, p, batch.valid[r], logits[r]) for r in range(u)]


def _cached(model: TransformerLM, prompt: tuple[int, ...], cache: PrefixCache, chain: list,
            device: torch.device, mode: str) -> Prefilled:
    p = len(prompt)
    scratch = model.new_kv_cache(1, max_seq_len=p)
    h = cache.fill(chain, scratch.k[:, 0], scratch.v[:, 0])
    scratch.seq_len = h
    ids = torch.tensor([prompt[h:]], dtype=torch.long, device=device)  # (1, P - h)
    positions = torch.arange(h, p, device=device)[None]  # (1, P - h)
    logits = prefill(model, ids, positions, None, scratch, mode)  # (1, V)
    return Prefilled(scratch, 0, p, torch.ones(p, dtype=torch.bool, device=device), logits[0], cached=h)


def _scored(model: TransformerLM, prompt: tuple[int, ...], top_n: int, device: torch.device) -> Prefilled:
    p = len(prompt)
    scratch = model.new_kv_cache(1, max_seq_len=p)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)  # (1, P)
    infos: list[LogprobInfo | None] = [None]
    last = None
    for a in range(0, p, CHUNK):
        b = min(a + CHUNK, p)
        logits = model(ids[:, a:b], torch.arange(a, b, device=device)[None], None, scratch)[0]  # (b - a, V)
        nxt = ids[0, a + 1 : b + 1]  # the token each position predicts (none after the last)
        if nxt.numel():
            infos += logprob_infos(logits[: nxt.shape[0]], nxt, top_n)
        last = logits[-1]
    return Prefilled(scratch, 0, p, torch.ones(p, dtype=torch.bool, device=device), last, prompt_logprobs=infos)


def prefill_prompts(model: TransformerLM, prompts: list[tuple[int, ...]], scored: dict[int, int],
                    cache: PrefixCache, pad_id: int, device: torch.device, mode: str = "model") -> list[Prefilled]:
    """Prefill every distinct prompt; scored maps prompt index -> top-n of the prompt logprobs wanted;
    mode: generate's prefill mode (PREFILL_MODES) of the joint and cached prompts."""
    out: list[Prefilled | None] = [None] * len(prompts)
    plain: list[int] = []
    for i, prompt in enumerate(prompts):
        if i in scored:
            out[i] = _scored(model, prompt, scored[i], device)
            continue
        chain = cache.match(prompt)
        if chain:
            out[i] = _cached(model, prompt, cache, chain, device, mode)
        else:
            plain.append(i)
    if plain:
        for i, res in zip(plain, _joint(model, [prompts[i] for i in plain], pad_id, device, mode)):
            out[i] = res
    done = [r for r in out if r is not None]  # every prompt has its result now
    for prompt, res in zip(prompts, done):
        offset = res.width - len(prompt)  # left padding of a joint row
        cache.store(prompt, _row_kv(res.cache, res.row, offset))
    return done
