"""Perplexity of a causal LM on documents, with a sliding window for documents longer than the context.

For a document x_1..x_L (a BOS is prepended when the model has one), windows of W tokens start every S
tokens (S <= W); each token is scored once, in the first window that contains it with context, from
the logits at the position before it (transformers' "perplexity of fixed-length models" recipe):
    window [b, e):  score tokens t in [max(prev_e, b + 1), e)   (prev_e = end of the previous window)
    NLL = -sum_t log p(x_t | x_<t within the window),  N = number of scored tokens
    perplexity = exp(NLL / N),   bits per byte = NLL / ln 2 / (UTF-8 bytes of the scored text)
S = W gives disjoint windows (fast, less context); a smaller S gives every token more context.
Shapes: windows are batched (B, W), right-padded; logits (B, W, V).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from scratchlm.align.logprobs import logits_of, model_device, token_logprobs


@dataclass
class Window:
    doc: int
    begin: int
    end: int
    first_scored: int  # absolute position of the first scored token


def plan_windows(lengths: list[int], window: int, stride: int) -> list[Window]:
    """The windows of every document (module docstring)."""
    if not 1 <= stride <= window or window < 2:
        raise ValueError(f"need 1 <= stride <= window and window >= 2, got stride={stride}, window={window}")
    out: list[Window] = []
    for d, length in enumerate(lengths):
        prev_end = 0
        for begin in range(0, max(length - 1, 1), stride):
            end = min(begin + window, length)
            first = max(prev_end, begin + 1)
            if first < end:
                out.append(Window(d, begin, end, first))
            prev_end = end
            if end == length:
                break
    return out


@torch.no_grad()
def perplexity(model: Any, docs: list[list[int]], window: int, stride: int | None = None, batch_size: int = 8,
               progress: bool = True) -> dict[str, float]:
    """{"nll", "tokens", "perplexity"} of `model` on token-id documents (module docstring)."""
    windows = plan_windows([len(d) for d in docs], window, stride or window)
    if not windows:
        raise ValueError("nothing to score: every document has fewer than 2 tokens")
    device = model_device(model)
    total, count = 0.0, 0
    bar = tqdm(range(0, len(windows), batch_size), desc="perplexity", disable=not progress, unit="batch")
    for s in bar:
        part = windows[s:s + batch_size]
        width = max(w.end - w.begin for w in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros(len(part), width - 1, dtype=torch.bool)  # over targets 1..width-1
        for r, w in enumerate(part):
            ids[r, : w.end - w.begin] = torch.tensor(docs[w.doc][w.begin:w.end])
            mask[r, w.first_scored - w.begin - 1: w.end - w.begin - 1] = True
        ids, mask = ids.to(device), mask.to(device)
        logits = logits_of(model(ids))  # (B, W, V)
        logp = token_logprobs(logits[:, :-1], ids[:, 1:])  # (B, W-1): token t+1 from position t
        total -= float(logp[mask].double().sum())
        count += int(mask.sum())
        bar.set_postfix(ppl=f"{math.exp(total / max(count, 1)):.3f}")
    return {"nll": total / count, "tokens": count, "perplexity": math.exp(total / count)}


def scored_bytes(tok: Any, docs: list[list[int]], first_scored: int) -> int:
    """UTF-8 bytes of each document's scored tokens (all but the first `first_scored` of each)."""
    decode = getattr(tok, "decode_bytes", None)
    n = 0
    for d in docs:
        piece = d[first_scored:]
        n += len(decode(piece)) if decode is not None else len(tok.decode(piece).encode("utf-8"))
    return n


def text_perplexity(model: Any, tok: Any, texts: list[str], window: int, stride: int | None = None,
                    bos_id: int | None = None, batch_size: int = 8, progress: bool = True) -> dict[str, float]:
    """perplexity() of raw texts, plus bits per byte; a BOS (bos_id) is prepended to each when given."""
    docs = [([bos_id] if bos_id is not None else []) + list(tok.encode(t)) for t in texts]
    result = perplexity(model, docs, window, stride, batch_size, progress)
    n_bytes = scored_bytes(tok, docs, 1)
    result["bits_per_byte"] = result["nll"] * result["tokens"] / math.log(2) / max(n_bytes, 1)
    result["documents"] = len(texts)
    return result
