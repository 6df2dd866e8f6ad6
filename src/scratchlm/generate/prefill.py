"""Prefill: the prompt's forward pass into the KV cache, in the model's precision or through a bf16 copy.

    "model"  model(ids (B, P), positions, mask, cache) -> last logits (B, V): the reference path
    "bf16"   the first P - 1 tokens through a bf16 copy of the model (made once per model, rebuilt after
             weight updates) into a bf16 scratch cache widened into the model's cache slots, then the last
             token through the model itself. A prompt is compute bound (2 * params FLOPs per token), and
             the CPU's bf16 matmul units (AVX512-BF16 / AMX through oneDNN) run ~2-3x the fp32 rate. The
             cost is bf16 rounding in the prompt's cached K/V (the last position's own activations stay
             in the model's dtype: a whole-bf16 prompt flipped SmolLM2's first answer token); tests
             bound the logit error, benchmarks/real_decode.py reports greedy agreement with HF fp32.
Only an fp32 model on CPU has a "bf16" prefill to gain; other models take the "model" path.

A short prompt (at most CHUNK_MAX_ROWS tokens in all rows; PROMPT_CHUNK_MAX_ROWS on ggml blocks) whose
decode step runs in C++ (FastDecoder.native) goes through that step's `chunk` instead of the model's forward
in "model" mode: the same function (its kernels are the ones the forward uses for so many rows) without ~30
torch ops per layer; a server's prefix-cache hit leaves a handful of new prompt tokens, where that dispatch
was most of the time to the first token. When every matrix is in ggml blocks, a longer prompt runs through the
chunk too, in pieces of PROMPT_CHUNK_MAX_ROWS tokens over all rows (each attends to the cache the pieces before
it filled): the forward's products past 512 rows go through widened tiles into torch's GEMM, and its attention,
norms and last layer run on every token (1B Q4_K_M, 2 Zen 5 cores: 512 tokens 142-157 -> 227-242 tok/s, 2048
tokens 80 -> 211; SmolLM2 Q4_K_M 2048 tokens 543-559 -> 1000-1014). Not across a longrope switch (the forward
picks one set of factors for the whole sequence).

longrope (Phi-3.5, Phi-4-mini) rotates with its short factors while the sequence is at most L0 =
original_max_position_embeddings long and with its long factors beyond. Keys cached below L0 carry the
short rotation, so at the step where the sequence reaches L0 + 1 tokens (`rope_switch_length`) the engine
recomputes the cache from the whole sequence (`recompute`), as transformers' Phi-3 `generate` does: every
step then equals the full forward of the sequence so far.
"""

from __future__ import annotations

import copy
import functools
import weakref

import torch

from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.model import TransformerLM
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.paged_kv_cache import PagedKVCache

PREFILL_MODES = ("model", "bf16")
# prompt tokens (all rows) the C++ chunk takes; beyond, the forward. SmolLM2-135M Q4_1 on a 2-core Zen 3, 27
# cached tokens + n new, chunk vs forward (then widened tiles past 24 rows): n = 10 55 vs 116 ms, 24: 125 vs 209,
# 32: 159 vs 219, 48: 239 vs 271 (docs/generation.md). Also the server's grain for C++ sets of joining prompt
# chunks and speculative verification (serve/joining.py, serve/speculation.py).
CHUNK_MAX_ROWS = 48
# the same for a decoder whose matrices are all ggml blocks (FastDecoder.prompt_gemm): its prompt rows run
# through block_gemm.h as the forward's do, and the chunk saves ~30 torch ops per layer. 2 threads, best of 3,
# chunk vs forward tok/s: 1B Q4_K_M 64 tokens 64 vs 59, 128: 58 vs 58, 256: 55 vs 55; SmolLM2 Q4_K_M 64: 333 vs
# 243, 128: 357 vs 319, 256: 350 vs 347 (a dense F16 0.6B at 256: 58 vs 68, so dense keeps CHUNK_MAX_ROWS)
PROMPT_CHUNK_MAX_ROWS = 256


@functools.cache
def _bf16_copies() -> weakref.WeakKeyDictionary:
    """model -> (weight versions, its bf16 copy)."""
    return weakref.WeakKeyDictionary()


def bf16_copy(model: TransformerLM) -> TransformerLM:
    """A bf16 copy of `model` (cached; re-made when any weight changed in place)."""
    versions = tuple(p._version for p in model.parameters())
    hit = _bf16_copies().get(model)
    if hit is None or hit[0] != versions:
        shared = {id(b): b for b in model.buffers() if b.dtype == torch.uint8}  # ggml blocks: shared, not copied
        shadow = copy.deepcopy(model, shared).to(torch.bfloat16).eval()
        if hasattr(shadow, "quantized_weights"):
            del shadow.quantized_weights  # the copy is bf16: its blocks would not describe it
        hit = _bf16_copies()[model] = (versions, shadow)
    return hit[1]


def chunk_fits(decoder: FastDecoder | None, ids: torch.Tensor, mask: torch.Tensor | None, cache: KVCache,
               mode: str) -> bool:
    """True when the C++ chunk runs this prefill: a decoder with a native step, the "model" mode, a contiguous
    fp32 cache, at most CHUNK_MAX_ROWS prompt tokens in all (PROMPT_CHUNK_MAX_ROWS when every matrix is in
    ggml blocks), and no mask or a (B, S + P) key mask."""
    if decoder is None or decoder.native is None or mode != "model" or type(cache) is not KVCache:
        return False
    b, p = ids.shape
    key_mask_ok = mask is None or (mask.dtype == torch.bool and tuple(mask.shape) == (b, cache.seq_len + p))
    limit = PROMPT_CHUNK_MAX_ROWS if decoder.prompt_gemm else CHUNK_MAX_ROWS
    return b * p <= limit and key_mask_ok and cache.k.dtype == torch.float32


def piece_tokens(model: TransformerLM, decoder: FastDecoder | None, ids: torch.Tensor, mask: torch.Tensor | None,
                 cache: KVCache, mode: str) -> int:
    """Tokens per row in each piece when a prompt too long for one chunk runs through it piece by piece (every
    matrix in ggml blocks, each piece fits the chunk, no longrope switch inside the prompt), else 0."""
    if decoder is None or not decoder.prompt_gemm:
        return 0
    b, p = ids.shape
    per = PROMPT_CHUNK_MAX_ROWS // b
    if per < 1 or p <= per:
        return 0
    switch = rope_switch_length(model)
    if switch is not None and cache.seq_len + p >= switch:
        return 0
    first = None if mask is None else mask[:, : cache.seq_len + per]
    return per if chunk_fits(decoder, ids[:, :per], first, cache, mode) else 0


def prefill(model: TransformerLM, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
            cache: KVCache, mode: str = "model", decoder: FastDecoder | None = None) -> torch.Tensor:
    """Run the prompt ids (B, P) into cache slots [s, s + P); returns the last position's logits (B, V).
    decoder: the decode step's FastDecoder (generate.decode_step.chunk_decoder); a short prompt then runs
    through its C++ chunk (the same function, without ~1 ms of torch dispatch per layer), and a long one on
    ggml blocks too, piece by piece (piece_tokens)."""
    if mode not in PREFILL_MODES:
        raise ValueError(f"unknown prefill mode {mode!r}; valid: {PREFILL_MODES}")
    if chunk_fits(decoder, ids, mask, cache, mode):
        return decoder.chunk(ids, positions, mask, cache)
    per = piece_tokens(model, decoder, ids, mask, cache, mode)
    if per:
        s = cache.seq_len
        for i in range(0, ids.shape[1], per):
            j = min(i + per, ids.shape[1])
            logits = decoder.chunk(ids[:, i:j], positions[:, i:j], None if mask is None else mask[:, : s + j], cache)
        return logits
    dtype = model.dtype
    if mode == "model" or dtype != torch.float32 or model.device.type != "cpu":
        return model(ids, positions, mask, cache, logits_to_keep=1)[:, -1]
    b, p = ids.shape
    if p > 1:  # all but the last prompt token through the bf16 copy, into the cache
        bf16_into(model, ids[:, :-1], positions[:, :-1], None if mask is None else mask[:, :-1], cache)
    # the last token (whose logits choose the first new token) through the model itself, in its dtype
    return model(ids[:, -1:], positions[:, -1:], mask, cache, logits_to_keep=1)[:, -1]


def rope_switch_length(model: TransformerLM) -> int | None:
    """L0 + 1 for a longrope model (the length at which its cache is recomputed), else None."""
    scaling = model.config.rope_scaling if model.config.pos_embedding == "rope" else None
    if scaling is None or scaling["rope_type"] != "longrope":
        return None
    return int(scaling["original_max_position_embeddings"]) + 1


def recompute(model: TransformerLM, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
              cache: KVCache, mode: str = "model") -> torch.Tensor:
    """Empty `cache` and prefill the whole sequence ids (B, S) again; the last position's logits (B, V)."""
    cache.reset()
    return prefill(model, ids, positions, mask, cache, mode)


def bf16_into(model: TransformerLM, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
              cache: KVCache) -> None:
    """ids (B, P) through the model's bf16 copy; its K/V widened into cache slots [s, s + P). A paged cache
    (nn/paged_kv_cache.py) widens what it stores and reads back in the caller's dtype: the copy runs on it."""
    shadow = bf16_copy(model)
    if isinstance(cache, PagedKVCache):
        shadow(ids, positions, mask, cache, logits_to_keep=1)
        return
    b, p = ids.shape
    s = cache.seq_len
    scratch = shadow.new_kv_cache(b, max_seq_len=s + p)
    if s:  # a continued prompt attends to what the cache already holds
        scratch.k[:, :, :, :s] = cache.k[:, :, :, :s]
        scratch.v[:, :, :, :s] = cache.v[:, :, :, :s]
        scratch.seq_len = s
    shadow(ids, positions, mask, scratch, logits_to_keep=1)
    cache.k[:, :, :, s: s + p] = scratch.k[:, :, :, s: s + p]  # (L, B, KvH, P, Hd) widened to the cache dtype
    cache.v[:, :, :, s: s + p] = scratch.v[:, :, :, s: s + p]
    cache.advance(p)
