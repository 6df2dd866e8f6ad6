"""The evidence every HF family / option must pass (used by test_hf_families.py and test_hf_parity.py).

For a tiny random-weight HF model saved to a directory and loaded by scratchlm:
  logits        fp32 max |diff| <= 1e-4 vs transformers, without and with a left-padding mask, on the
                reference path and on the sdpa + fused-ops path
  greedy        20 new tokens of batched ragged (left-padded) prompts identical to HF `generate`, through
                the engine's model step and the FastDecoder
  save          save_pretrained writes the very tensors of the HF checkpoint and transformers reloads them
                into identical logits
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from interop_helpers import randomize_, safetensors_state
from transformers import AutoModelForCausalLM

import scratchlm
from scratchlm.generate.engine import generate
from scratchlm.interop.hf.state_dict import IGNORED_SUFFIXES

LOGIT_TOL = 1e-4
FAST = {"attn_impl": "sdpa", "ops_impl": "fused"}
N_NEW = 20


@dataclass
class Case:
    """One HF architecture setting: class, config class and kwargs; prompts longer than any window."""

    hf_cls: Any
    config_cls: Any
    kwargs: dict[str, Any]
    prompt_lens: tuple[int, ...] = (24, 17, 9)
    fast_overrides: dict[str, Any] = field(default_factory=lambda: dict(FAST))
    seed: int = 0


def build(case: Case) -> torch.nn.Module:
    model = case.hf_cls(case.config_cls(**case.kwargs))
    return randomize_(model, case.seed).eval()


def padded_batch(case: Case, vocab: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids (B, P), mask (B, P) and per-row positions (HF's cumsum rule) of ragged prompts."""
    g = torch.Generator().manual_seed(seed)
    p = max(case.prompt_lens)
    ids = torch.zeros(len(case.prompt_lens), p, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, n in enumerate(case.prompt_lens):
        ids[row, p - n:] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, p - n:] = True
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    return ids, mask, positions


@torch.no_grad()
def check_logits(hf: torch.nn.Module, directory: Path, case: Case) -> None:
    """Both paths, without a mask (full rows) and with left padding (compared on real tokens only)."""
    ids, mask, positions = padded_batch(case, hf.config.vocab_size)
    full = ids.clone()
    full[~mask] = 7  # the same rows without padding
    expected_full = hf(full).logits.float()
    expected_pad = hf(ids, attention_mask=mask.long(), position_ids=positions).logits.float()
    for overrides in ({}, case.fast_overrides):
        ours = scratchlm.from_pretrained(directory, **overrides)
        diff = (ours(full) - expected_full).abs().max().item()
        assert diff <= LOGIT_TOL, (overrides, "no mask", diff)
        got = ours(ids, token_positions=positions, attention_mask=mask)
        diff = (got - expected_pad)[mask].abs().max().item()
        assert diff <= LOGIT_TOL, (overrides, "left padding", diff)


@torch.no_grad()
def check_greedy(hf: torch.nn.Module, directory: Path, case: Case) -> None:
    """HF generate on the left-padded batch == our engine (model step and FastDecoder)."""
    ids, mask, _ = padded_batch(case, hf.config.vocab_size, seed=2)
    out = hf.generate(ids, attention_mask=mask.long(), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                      do_sample=False, pad_token_id=0)
    expected = out[:, ids.shape[1]:].tolist()
    assert len({t for row in expected for t in row}) >= 8, "a degenerate continuation proves little"
    prompts = [row[m].tolist() for row, m in zip(ids, mask)]
    ours = scratchlm.from_pretrained(directory, **case.fast_overrides)
    for decode in ("model", "fast"):
        assert generate(ours, prompts, N_NEW, decode=decode) == expected, decode


@torch.no_grad()
def check_save(hf: torch.nn.Module, directory: Path, out: Path) -> None:
    """Our export == the HF checkpoint tensor by tensor, and transformers reloads it to identical logits."""
    ours = scratchlm.from_pretrained(directory)
    scratchlm.save_pretrained(ours, out)
    original = {k: v for k, v in safetensors_state(directory).items() if not k.endswith(IGNORED_SUFFIXES)}
    exported = safetensors_state(out)
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded) is type(hf)
    original_model = AutoModelForCausalLM.from_pretrained(directory).eval()  # fresh: dynamic RoPE keeps state
    ids = torch.randint(0, hf.config.vocab_size, (2, 30), generator=torch.Generator().manual_seed(3))
    assert torch.equal(reloaded(ids).logits, original_model(ids).logits)
    back = scratchlm.from_pretrained(out)
    assert back.config == ours.config
