"""Every supported HF family and option, exact against transformers (see family_evidence.py for the checks);
mixture-of-experts models are checked with the dense reference and with the grouped fast path.

Tiny random-weight models (2 layers, hidden 64) built locally; prompts (up to 24 tokens) + 20 new tokens
are longer than every sliding window and every scaled-RoPE original context in the table.
"""

from __future__ import annotations

import pytest
from family_evidence import FAST, Case, build, check_greedy, check_logits, check_save
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GemmaConfig,
                          GemmaForCausalLM, GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Olmo2Config,
                          Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, SmolLM3Config, SmolLM3ForCausalLM)

V = 96
BASE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
            pad_token_id=None)
MOE = dict(BASE, intermediate_size=48, num_experts_per_tok=2)
GROUPED = {**FAST, "moe_impl": "grouped"}  # the MoE fast path is checked on the fast side
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
    # longrope past L0 from the first forward (padded prompts of 24 > 20 tokens): a LlamaForCausalLM's generate
    # keeps the keys it cached with the short factors once the sequence passes L0, Phi-3's recomputes them (as
    # scratchlm's engine does; see phi3_longrope_crossing)
    "llama_longrope": Case(LlamaForCausalLM, LlamaConfig,
                           dict(BASE, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                       "original_max_position_embeddings": 20,
                                                       "short_factor": [1.0 + 0.2 * i for i in range(8)],
                                                       "long_factor": [1.5 + 0.7 * i for i in range(8)]})),
    # rope_scaling (old key) wins over rope_parameters; its missing theta comes from the top-level rope_theta
    "llama_old_rope_scaling_key": Case(LlamaForCausalLM, LlamaConfig,
                                       dict(BASE, rope_theta=300.0, rope_scaling={"type": "linear", "factor": 2.0})),
    # sliding windows: W = 6 with prompts of 9..24 tokens + 20 new ones
    "mistral_window": Case(MistralForCausalLM, MistralConfig, dict(BASE, sliding_window=6, head_dim=24)),
    "mistral_no_window": Case(MistralForCausalLM, MistralConfig, dict(BASE, sliding_window=None)),
    "qwen2_window_from_layer_1": Case(Qwen2ForCausalLM, Qwen2Config,
                                      dict(BASE, use_sliding_window=True, sliding_window=5, max_window_layers=1)),
    "qwen3_window_layer_types": Case(Qwen3ForCausalLM, Qwen3Config,
                                     dict(BASE, head_dim=16, use_sliding_window=True, sliding_window=7,
                                          layer_types=["sliding_attention", "full_attention"])),
    # Gemma: (1 + w) norms, sqrt(D) embeddings, GeGLU, head_dim != D / H, tied head
    "gemma": Case(GemmaForCausalLM, GemmaConfig, dict(BASE, head_dim=24, hidden_act="gelu", attention_bias=True)),
    "llama_gelu_glu": Case(LlamaForCausalLM, LlamaConfig, dict(BASE, hidden_act="gelu")),
    # Gemma-2: + four norms per block, query_pre_attn_scalar, both soft-caps, local/global layers (W = 6)
    "gemma2": Case(Gemma2ForCausalLM, Gemma2Config,
                   dict(BASE, head_dim=24, query_pre_attn_scalar=40, sliding_window=6, attn_logit_softcapping=8.0,
                        final_logit_softcapping=5.0, tie_word_embeddings=False)),
    # Gemma-3 text: + QK-norm, local RoPE base, 5:1 local/global pattern, scaled global RoPE; its
    # attn_logit_softcapping is ignored by transformers, hence by us
    "gemma3": Case(Gemma3ForCausalLM, Gemma3TextConfig,
                   dict(BASE, num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=32, sliding_window=5,
                        sliding_window_pattern=2, final_logit_softcapping=6.0, attn_logit_softcapping=1.0,
                        tie_word_embeddings=False,
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e5},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})),
    # Phi-3 / Phi-3.5 / Phi-4: fused qkv_proj and gate_up_proj, longrope past original_max_position_embeddings
    # (top level, as Phi-3 checkpoints store it), a sliding window on every layer
    "phi3_longrope_window": Case(Phi3ForCausalLM, Phi3Config,
                                 dict(BASE, original_max_position_embeddings=20, sliding_window=11,
                                      rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                       "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                                       "long_factor": [1.2 + 0.5 * i for i in range(8)]})),
    # Phi-4-mini: partial rotary (3/4 of each head) + longrope; the fast side also re-pairs RoPE "interleaved"
    # (q/k rows permuted on load, the pass-through dims left in place)
    "phi4_mini_partial_rotary": Case(Phi3ForCausalLM, Phi3Config,
                                     dict(BASE, partial_rotary_factor=0.75, original_max_position_embeddings=20,
                                          rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                           "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                                           "long_factor": [1.2 + 0.5 * i for i in range(6)]}),
                                     fast_overrides={**FAST, "rope_style": "interleaved"}),
    # Phi-3.5: prompts (12, 9, 5 tokens) within L0 = 20 rotate with the short factors; generation passes L0
    # and the cache is recomputed with the long ones, as transformers' Phi-3 generate does
    "phi3_longrope_crossing": Case(Phi3ForCausalLM, Phi3Config,
                                   dict(BASE, original_max_position_embeddings=20, sliding_window=None,
                                        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                                         "short_factor": [1.0 + 0.2 * i for i in range(8)],
                                                         "long_factor": [1.5 + 0.7 * i for i in range(8)]}),
                                   prompt_lens=(12, 9, 5)),
    "phi3_plain": Case(Phi3ForCausalLM, Phi3Config, dict(BASE, sliding_window=None, tie_word_embeddings=True)),
    # OLMo-2: norms on the sublayer outputs, QK-norm over the whole projection
    "olmo2": Case(Olmo2ForCausalLM, Olmo2Config, dict(BASE, attention_bias=True)),
    # Granite: the four multipliers
    "granite": Case(GraniteForCausalLM, GraniteConfig,
                    dict(BASE, embedding_multiplier=6.0, residual_multiplier=0.3, attention_multiplier=0.07,
                         logits_scaling=1.7, attention_bias=True)),
    # SmolLM3: NoPE on every 2nd layer, sliding window on the NoPE layers, biases
    "smollm3": Case(SmolLM3ForCausalLM, SmolLM3Config,
                    dict(BASE, no_rope_layer_interval=2, use_sliding_window=True, sliding_window=7,
                         attention_bias=True, mlp_bias=True)),
    # Mixtral: softmax -> top-2 -> renormalise, 4 experts, sliding window on every layer
    "mixtral_window": Case(MixtralForCausalLM, MixtralConfig, dict(MOE, num_local_experts=4, sliding_window=9),
                           fast_overrides=GROUPED),
    # Qwen3-MoE: QK-norm, norm_topk_prob, a dense layer (mlp_only_layers), 6 experts of width 32
    "qwen3_moe": Case(Qwen3MoeForCausalLM, Qwen3MoeConfig,
                      dict(MOE, num_experts=6, moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1]),
                      fast_overrides=GROUPED),
    # Qwen2-MoE: a sigmoid-gated shared expert, q/k/v bias, top-k weights not renormalised
    "qwen2_moe": Case(Qwen2MoeForCausalLM, Qwen2MoeConfig,
                      dict(MOE, num_experts=5, moe_intermediate_size=32, shared_expert_intermediate_size=40,
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


def test_gemma3_vision_language_checkpoint_loads_its_text_model(tmp_path):
    """Gemma-3 4B+ ship as Gemma3ForConditionalGeneration: the text model loads (vision tower dropped, with a
    warning), matches HF on text-only input (logits, greedy) and saves as a Gemma3ForCausalLM."""
    import torch
    from interop_helpers import randomize_
    from transformers import AutoModelForCausalLM, Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    import scratchlm
    from scratchlm.generate.engine import generate

    text = Gemma3TextConfig(**dict(BASE, vocab_size=120, head_dim=16, sliding_window=5, sliding_window_pattern=2))
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                          image_token_index=119, boi_token_index=117, eoi_token_index=118)
    hf = randomize_(Gemma3ForConditionalGeneration(config), seed=3).eval()
    hf.save_pretrained(tmp_path / "vlm")
    with pytest.warns(UserWarning, match="vision tower and projector"):
        ours = scratchlm.from_pretrained(tmp_path / "vlm")
    ids = torch.randint(0, 110, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        assert (ours(ids) - expected).abs().max().item() <= 1e-4
        out = hf.generate(ids[:1, :12], max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert generate(ours, ids[:1, :12].tolist(), 20, decode="fast") == out[:, 12:].tolist()
    scratchlm.save_pretrained(ours, tmp_path / "text")
    text_only = AutoModelForCausalLM.from_pretrained(tmp_path / "text").eval()
    assert type(text_only).__name__ == "Gemma3ForCausalLM"
    with torch.no_grad():
        assert (text_only(ids).logits - expected).abs().max().item() <= 1e-5
