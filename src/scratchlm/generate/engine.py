"""Generation engine: prefill the (left-padded) prompts into a static KV cache, then decode one token
per step for the whole batch.

    prefill:  logits = model(ids (B, P), positions (B, P), key_mask[:, :P], cache)   -> cache slots [0, P)
    step i:   x_i = choose(logits[:, -1]);  logits = model(x_i (B, 1), pos + i, key_mask[:, :P+i+1], cache)

The cache is allocated once per call with exactly P + max_new_tokens slots (B, KvH, S, Hd per layer),
so decoding never reallocates. Context policy: P + max_new_tokens must fit the model's max_seq_len;
otherwise a ValueError says by how much and what to change (no silent sliding window).
Outputs are the new tokens of each row, including the stop token that ended it (if any).
A longrope model (Phi-3.5, Phi-4-mini) whose sequence grows past original_max_position_embeddings has its
cache recomputed once at that step (generate/prefill.py), as transformers' Phi-3 generate does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Callable

import torch

from scratchlm.generate.batching import check_prompts, left_pad
from scratchlm.generate.decode_step import chunk_decoder, make_decode_step
from scratchlm.generate.prefill import prefill as run_prefill
from scratchlm.generate.prefill import recompute, rope_switch_length
from scratchlm.generate.sampling import SamplingParams, choose_next_token, make_generator, token_counts
from scratchlm.generate.speculative import Speculation, iter_speculative
from scratchlm.generate.stopping import StopChecker
from scratchlm.model import TransformerLM


def check_context(prompt_len: int, max_new_tokens: int, max_seq_len: int) -> None:
    """Raise a ValueError when prompt + new tokens would not fit the context window."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    need = prompt_len + max_new_tokens
    if need > max_seq_len:
        room = max_seq_len - prompt_len
        fix = f"lower max_new_tokens to {room}" if room > 0 else f"shorten the prompt below {max_seq_len} tokens"
        raise ValueError(
            f"context overflow: prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} = {need} > "
            f"the model's max_seq_len={max_seq_len}; {fix} (the engine never slides the window silently)"
        )


def sampling_params(**kwargs: Any) -> SamplingParams:
    """SamplingParams from keyword arguments, with a ValueError naming unknown keys."""
    valid = set(SamplingParams.__dataclass_fields__)
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        raise ValueError(f"unknown sampling option(s) {unknown}; valid: {sorted(valid)}")
    return SamplingParams(**kwargs)


@torch.inference_mode()
def iter_decode(
    model: TransformerLM,
    prompts: list[list[int]],
    max_new_tokens: int,
    params: SamplingParams,
    seed: int | None = None,
    pad_id: int = 0,
    decode: str = "model",
    prefill: str = "model",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (next token (B,) int64, the raw logits (B, V) it was chosen from), max_new_tokens times.

    The caller stops early by closing the iterator (e.g. `break` once every row has stopped).
    decode: how each step runs, one of generate.decode_step.DECODE_MODES ("model" = the reference forward,
    "fast" = packed weights, same result; "fast-int8", ...; "compiled"). The prompt prefills through the
    model's forward; prefill="bf16" runs it on a bf16 copy instead (generate/prefill.py: faster on CPUs
    with bf16 matmul units, at bf16 rounding of the prompt's activations).
    """
    check_prompts(prompts, model.config.vocab_size)
    step = make_decode_step(model, decode, batch_size=len(prompts))
    device = model.device
    batch = left_pad(prompts, pad_id, device)
    b, p = batch.ids.shape
    check_context(p, max_new_tokens, model.config.max_seq_len)
    cache = model.new_kv_cache(b, max_seq_len=p + max_new_tokens)
    key_mask = None
    if batch.has_padding:
        key_mask = torch.ones(b, p + max_new_tokens, dtype=torch.bool, device=device)  # (B, S)
        key_mask[:, :p] = batch.valid
    counts = token_counts(batch.ids, model.config.vocab_size, batch.valid) if params.uses_counts else None
    generator = make_generator(seed, device)
    prefill_mask = None if key_mask is None else key_mask[:, :p]
    logits = run_prefill(model, batch.ids, batch.positions, prefill_mask, cache, prefill,
                         decoder=chunk_decoder(model, decode))  # (B, V); a short prompt: the C++ chunk
    positions = batch.lengths[:, None].clone()  # (B, 1) position of the next token
    switch = rope_switch_length(model)  # longrope: recompute the cache once the sequence passes L0
    history = [batch.ids] if switch is not None and p < switch else None  # (B, P) + each new (B, 1)
    for i in range(max_new_tokens):
        token = choose_next_token(logits, params, counts, generator)  # (B,)
        yield token, logits
        if i == max_new_tokens - 1:
            return
        if counts is not None:
            counts.scatter_add_(1, token[:, None], torch.ones_like(token[:, None], dtype=counts.dtype))
        mask = None if key_mask is None else key_mask[:, : p + i + 1]
        if history is not None:
            history.append(token[:, None])
        if p + i + 1 == switch and history is not None:  # the sequence reaches L0 + 1 tokens
            new_positions = batch.lengths[:, None] + torch.arange(i + 1, device=device)  # (B, i + 1)
            logits = recompute(model, torch.cat(history, 1), torch.cat((batch.positions, new_positions), 1),
                               mask, cache, prefill)
        else:
            logits = step(token[:, None], positions, mask, cache)  # (B, V)
        positions += 1


def generate(
    model: TransformerLM,
    prompts: list[list[int]],
    max_new_tokens: int = 64,
    *,
    stop_token_ids: Iterable[int] = (),
    stop_strings: Iterable[str] = (),
    tokenizer: Any = None,
    seed: int | None = None,
    pad_id: int = 0,
    decode: str = "model",
    prefill: str = "model",
    on_token: Callable[[int, int], None] | None = None,
    speculative: Speculation | None = None,
    **sampling: Any,
) -> list[list[int]]:
    """Generate up to max_new_tokens for every prompt; returns each row's new token ids.

    sampling: SamplingParams fields (temperature, top_k, top_p, min_p, repetition_penalty,
    frequency_penalty, presence_penalty); temperature 0 (default) is greedy. A row ends at its first
    stop token id (kept in the output) or when its decoded text contains a stop string (needs
    `tokenizer`; the completing token is kept). on_token(row, token) is called for every kept token.
    decode: "model" (reference), "fast", "fast-int8", ... or "compiled"; prefill: "model" or "bf16" (see
    iter_decode). speculative: draft tokens and verify several per forward (generate/speculative.py; each
    prompt on its own): greedy outputs are the same, sampled ones follow the same distribution.
    """
    params = sampling_params(**sampling)
    stopper = StopChecker(len(prompts), stop_token_ids, stop_strings, tokenizer)
    outputs: list[list[int]] = [[] for _ in prompts]
    if speculative is not None:
        check_prompts(prompts, model.config.vocab_size)
        for row, prompt in enumerate(prompts):
            check_context(len(prompt), max_new_tokens, model.config.max_seq_len)
            row_seed = None if seed is None else seed + row
            steps = iter_speculative(model, list(prompt), max_new_tokens, params, speculative, row_seed, decode, prefill)
            _keep(row, (tok for tokens in steps for tok in tokens), stopper, outputs[row], on_token)
        return outputs
    for token, _ in iter_decode(model, prompts, max_new_tokens, params, seed, pad_id, decode, prefill):
        for row, tok in enumerate(token.tolist()):
            if stopper.done[row]:
                continue
            outputs[row].append(tok)
            stopper.push(row, tok)
            if on_token is not None:
                on_token(row, tok)
        if stopper.all_done:
            break
    return outputs


def _keep(row: int, tokens: Iterable[int], stopper: StopChecker, out: list[int],
          on_token: Callable[[int, int], None] | None) -> None:
    """Append row `row`'s tokens to `out` until its stop rule fires (a speculative run's tokens, in order)."""
    for tok in tokens:
        out.append(tok)
        stopper.push(row, tok)
        if on_token is not None:
            on_token(row, tok)
        if stopper.done[row]:
            return
