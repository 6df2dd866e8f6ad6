"""Mixture-of-experts families exact against transformers (checks in family_evidence.py): the reference
(every expert, dense combine) and the grouped fast path (+ sdpa, fused ops), greedy decoding through the
engine and the FastDecoder, and save_pretrained back to the Hub's per-expert checkpoint layout."""

from __future__ import annotations

import pytest
from family_evidence import FAST, Case, build, check_greedy, check_logits, check_save
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
            pad_token_id=None, num_experts_per_tok=2)
GROUPED = {**FAST, "moe_impl": "grouped"}
CASES = {
    # Mixtral: softmax -> top-2 -> renormalise, 4 experts, sliding window on every layer
    "mixtral_window": Case(MixtralForCausalLM, MixtralConfig, dict(BASE, num_local_experts=4, sliding_window=9),
                           fast_overrides=GROUPED),
    # Qwen3-MoE: QK-norm, norm_topk_prob, a dense layer (mlp_only_layers), 6 experts of width 32
    "qwen3_moe": Case(Qwen3MoeForCausalLM, Qwen3MoeConfig,
                      dict(BASE, num_experts=6, moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]),
                      fast_overrides=GROUPED),
    # Qwen2-MoE: a sigmoid-gated shared expert, q/k/v bias, top-k weights not renormalised
    "qwen2_moe": Case(Qwen2MoeForCausalLM, Qwen2MoeConfig,
                      dict(BASE, num_experts=5, moe_intermediate_size=32, shared_expert_intermediate_size=40,
                           norm_topk_prob=False), fast_overrides=GROUPED),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case_dir(request, tmp_path_factory):
    case = CASES[request.param]
    hf = build(case)
    directory = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(directory)
    return case, hf, directory


def test_logits_match_hf(case_dir):
    case, hf, directory = case_dir
    check_logits(hf, directory, case)


def test_greedy_batched_ragged_matches_hf_generate(case_dir):
    case, hf, directory = case_dir
    check_greedy(hf, directory, case)


def test_save_pretrained_round_trip(case_dir, tmp_path):
    _, hf, directory = case_dir
    check_save(hf, directory, tmp_path / "out")
