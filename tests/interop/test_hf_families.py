"""Every supported HF family and option, exact against transformers (see family_evidence.py for the checks).

Tiny random-weight models (2 layers, hidden 64) built locally; prompts (up to 24 tokens) + 20 new tokens
are longer than every sliding window and every scaled-RoPE original context in the table.
"""

from __future__ import annotations

import pytest
from family_evidence import Case, build, check_greedy, check_logits, check_save
from transformers import LlamaConfig, LlamaForCausalLM

V = 96
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
            pad_token_id=None)
L0 = 16  # original context of the scaled-RoPE cases: prompts and generations go well past it
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": L0, "rope_theta": 500.0}
CASES = {
    "llama3_rope": Case(LlamaForCausalLM, LlamaConfig, dict(BASE, rope_parameters=LLAMA3)),
    "llama_linear_rope": Case(LlamaForCausalLM, LlamaConfig,
                              dict(BASE, rope_parameters={"rope_type": "linear", "factor": 2.5, "rope_theta": 1e4})),
    "llama_dynamic_rope": Case(LlamaForCausalLM, LlamaConfig,
                               dict(BASE, max_position_embeddings=L0 + 8,
                                    rope_parameters={"rope_type": "dynamic", "factor": 3.0, "rope_theta": 1e4})),
    "llama_yarn_rope": Case(LlamaForCausalLM, LlamaConfig,
                            dict(BASE, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                        "original_max_position_embeddings": L0, "beta_fast": 8})),
    "llama_longrope": Case(LlamaForCausalLM, LlamaConfig,
                           dict(BASE, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                       "original_max_position_embeddings": 30,
                                                       "short_factor": [1.0 + 0.2 * i for i in range(8)],
                                                       "long_factor": [1.5 + 0.7 * i for i in range(8)]})),
    # rope_scaling (old key) wins over rope_parameters; its missing theta comes from the top-level rope_theta
    "llama_old_rope_scaling_key": Case(LlamaForCausalLM, LlamaConfig,
                                       dict(BASE, rope_theta=300.0, rope_scaling={"type": "linear", "factor": 2.0})),
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
