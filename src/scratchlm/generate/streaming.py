"""Streaming generation: text deltas as tokens arrive, for one prompt.

Every yielded delta is whole characters (the UTF-8 decoder holds a partial character back until its
last byte arrives) and never contains any part of a stop string (a text tail that could still grow
into one is held back until it cannot). The text of a stop token id (e.g. <|im_end|>) is not shown.
"".join(deltas) equals the final text of the reply.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from scratchlm.generate.batching import check_prompts
from scratchlm.generate.engine import check_context, iter_decode, sampling_params
from scratchlm.generate.speculative import Speculation, iter_speculative
from scratchlm.generate.stopping import StopChecker
from scratchlm.model import TransformerLM
from scratchlm.tokenizer.chat.render import default_stop_ids



def stream_generate(
    model: TransformerLM,
    tokenizer: Any,
    prompt: list[int],
    max_new_tokens: int = 256,
    *,
    stop_token_ids: Iterable[int] | None = None,
    stop_strings: Iterable[str] = (),
    seed: int | None = None,
    decode: str = "model",
    prefill: str = "model",
    speculative: Speculation | None = None,
    **sampling: Any,
) -> Iterator[str]:
    """Yield text deltas of the reply to `prompt` (token ids). stop_token_ids=None -> default_stop_ids.
    decode / prefill: the engine's step and prompt paths (see generate.engine.iter_decode); speculative: draft
    and verify several tokens per forward (generate/speculative.py: the same greedy text, the same
    distribution when sampling)."""
    params = sampling_params(**sampling)
    stop_ids = default_stop_ids(tokenizer) if stop_token_ids is None else list(stop_token_ids)
    stopper = StopChecker(1, stop_ids, stop_strings, tokenizer, track_text=True)
    shown = 0
    if speculative is not None:
        check_prompts([prompt], model.config.vocab_size)
        check_context(len(prompt), max_new_tokens, model.config.max_seq_len)
        steps = iter_speculative(model, list(prompt), max_new_tokens, params, speculative, seed, decode, prefill)
        tokens: Iterator[int] = (t for chunk in steps for t in chunk)
    else:
        tokens = (int(t[0]) for t, _ in iter_decode(model, [prompt], max_new_tokens, params, seed, 0, decode, prefill))
    for token in tokens:
        stopper.push(0, token)
        if stopper.done[0]:
            break
        end = stopper.stable_len(0)
        if end > shown:
            yield stopper.text(0)[shown:end]
            shown = end
    stopper.finish(0)
    text = stopper.text(0)
    if len(text) > shown:
        yield text[shown:]
