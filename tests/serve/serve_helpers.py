"""Reference outputs for the serve tests, computed in-process by the generation engine
(`scratchlm.generate.streaming.stream_generate`, itself tested against full-forward decoding)."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx
import openai

from scratchlm.generate.streaming import stream_generate
from scratchlm.tokenizer import render_chat

from tiny_checkpoint import API_KEY


def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=API_KEY, max_retries=0, timeout=60)


def async_client(server: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.api, api_key=API_KEY, max_retries=0, timeout=120)


def ref_completion(reference: tuple, prompt: str, max_tokens: int, **sampling: Any) -> str:
    """The engine's reply to a plain-text prompt, stopping at the model's stop tokens like /v1/completions
    (a scratchlm checkpoint's: <|endoftext|> and <|im_end|>)."""
    model, tok = reference
    stops = [tok.special_token_ids["<|endoftext|>"], tok.special_token_ids["<|im_end|>"]]
    return "".join(stream_generate(model, tok, tok.encode(prompt), max_tokens, stop_token_ids=stops, **sampling))


def ref_chat(reference: tuple, messages: list[dict], max_tokens: int, **sampling: Any) -> str:
    """The engine's reply to a ChatML conversation, stopping at <|im_end|> / <|endoftext|>."""
    model, tok = reference
    ids, _ = render_chat(tok, messages, add_generation_prompt=True)
    return "".join(stream_generate(model, tok, ids, max_tokens, **sampling))


def wait_for_url(process: subprocess.Popen, timeout: float) -> str:
    """The URL a `scratchlm serve` subprocess prints, once its /health answers (RuntimeError past timeout)."""
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    line = process.stdout.readline()  # blocks until the server prints its address (or exits)
    if "serving" not in line:
        process.kill()
        raise RuntimeError(f"server did not start (printed {line!r}); see server.log beside the checkpoint")
    url = line.split(" on ", 1)[1].split()[0]
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return url
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server at {url} did not answer /health within {timeout}s")
