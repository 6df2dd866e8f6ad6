"""Small models shared by the generation tests (random weights, fp32)."""

from __future__ import annotations

import torch

from scratchlm.config import ModelConfig, get_preset
from scratchlm.model import TransformerLM

VARIANTS = {
    "llama-gqa-half": dict(n_kv_heads=2, rope_style="half"),
    "llama-gqa-interleaved": dict(n_kv_heads=2, rope_style="interleaved"),
    "llama-mha": dict(n_kv_heads=4),
    "llama-mqa": dict(n_kv_heads=1),
    "llama-sdpa": dict(n_kv_heads=2, attn_impl="sdpa"),
}


def small_config(variant: str) -> ModelConfig:
    """A 2-layer, D=64 model of the given variant ("gpt2-tiny" = the gpt2-tiny preset, shrunk)."""
    shrink = dict(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=64)
    if variant == "gpt2-tiny":
        return get_preset("gpt2-tiny", **shrink)
    return get_preset("llama-tiny", **shrink, **VARIANTS[variant])


def window_config() -> ModelConfig:
    """A tiny GQA llama with a 5-token sliding window (paged-KV and speculative-decoding tests)."""
    return get_preset("llama-tiny", vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64,
                      sliding_window=5)


def build(config: ModelConfig, seed: int = 0, scale: float = 1.0) -> TransformerLM:
    """Random model in eval mode; `scale` > 1 sharpens the logits so greedy outputs vary (untied head)."""
    torch.manual_seed(seed)
    model = TransformerLM(config).eval()
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(scale)
    return model


def greedy_full_forward(model: TransformerLM, prompt: list[int], n: int) -> list[int]:
    """Reference greedy decoding without a cache: re-run the whole sequence every step."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(prompt):]
