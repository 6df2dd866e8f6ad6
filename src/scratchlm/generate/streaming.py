"""Streaming generation: text deltas as tokens arrive, for one prompt.

Every yielded delta is whole characters (the UTF-8 decoder holds a partial character back until its
last byte arrives) and never contains any part of a stop string (a text tail that could still grow
into one is held back until it cannot). The text of a stop token id (e.g. <|im_end|>) is not shown.
"".join(deltas) equals the final text of the reply.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from scratchlm.generate.engine import iter_decode, sampling_params
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
    **sampling: Any,
) -> Iterator[str]:
    """Yield text deltas of the reply to `prompt` (token ids). stop_token_ids=None -> default_stop_ids.
    decode / prefill: the engine's step and prompt paths (see generate.engine.iter_decode)."""
    params = sampling_params(**sampling)
    stop_ids = default_stop_ids(tokenizer) if stop_token_ids is None else list(stop_token_ids)
    stopper = StopChecker(1, stop_ids, stop_strings, tokenizer, track_text=True)
    shown = 0
    for token, _ in iter_decode(model, [prompt], max_new_tokens, params, seed, 0, decode, prefill):
        stopper.push(0, int(token[0]))
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
