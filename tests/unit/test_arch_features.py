"""The architecture features of the model families, each as a ModelConfig field, through every path:
the reference forward is the definition (proved against transformers in tests/interop); here the fused
fast path (values and gradients), the cached decode and the FastDecoder must compute the same function.
Configs mix several features at once (and sliding windows shorter than the sequences)."""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import ModelConfig
from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.model import TransformerLM

BASE = dict(vocab_size=80, d_model=48, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=64, tie_embeddings=False)
FEATURES = {
    # Gemma-2/3: (1 + w) norms, sqrt(D) embedding scale, GeGLU, head_dim != D/H, four norms per block,
    # query_pre_attn_scalar, both soft-caps, alternating local/global layers with a local RoPE base, QK-norm
    "gemma": dict(norm_unit_offset=True, embedding_multiplier=48 ** 0.5, ffn="glu", activation="gelu_tanh",
                  head_dim=16, norm_placement="sandwich", attn_scale=24 ** -0.5, attn_softcap=20.0,
                  final_softcap=10.0, sliding_window=5, rope_local_base=100.0, qk_norm=True,
                  layer_types=("sliding_attention", "full_attention", "sliding_attention")),
    # OLMo-2: norms on the sublayer outputs only, QK-norm over the whole projection
    "olmo2": dict(norm_placement="output", qk_norm=True, qk_norm_scope="projection"),
    # Granite: embedding / residual / attention multipliers and logits scaling; + llama3 RoPE
    "granite": dict(embedding_multiplier=3.0, residual_multiplier=0.4, attn_scale=0.05, logits_scaling=2.5,
                    rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
    # mixture of experts: top-2 of 4 SwiGLU experts + a shared expert, a dense middle layer, grouped path
    "moe": dict(moe_num_experts=4, moe_top_k=2, moe_d_ff=40, moe_shared_d_ff=24, moe_dense_layers=(1,),
                moe_norm_topk_prob=False, moe_impl="grouped", sliding_window=6),
    # partial rotary (8 of 12 head dims, Phi-4-mini style) with interleaved pairs and NoPE on the middle layer
    "partial_rotary": dict(rotary_dim=8, rope_style="interleaved", nope_layers=(1,)),
    # exact GELU gate, biases, longrope past its original context
    "glu_longrope": dict(ffn="glu", activation="gelu", qkv_bias=True, mlp_bias=True,
                         rope_scaling={"rope_type": "longrope", "original_max_position_embeddings": 10,
                                       "short_factor": [1.0 + i / 10 for i in range(6)],
                                       "long_factor": [2.0 + i / 3 for i in range(6)]}),
}


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def build(name: str, **overrides) -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(**{**BASE, **FEATURES[name], **overrides})).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:  # gains away from 1 (and from 0 for the 1 + w form), biases non-zero
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + (0.2 if "norm" in n else -0.25))
            else:
                p.mul_(5.0)
    return model


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_fused_path_equals_reference_values_and_grads(name):
    ids = torch.randint(0, 80, (2, 21), generator=torch.Generator().manual_seed(2))
    ref, fast = build(name), build(name, attn_impl="sdpa", ops_impl="fused")
    fast.load_state_dict(ref.state_dict())
    out_ref, out_fast = ref(ids), fast(ids)
    torch.testing.assert_close(out_fast, out_ref, rtol=1e-4, atol=1e-4)
    out_ref.logsumexp(-1).sum().backward()
    out_fast.logsumexp(-1).sum().backward()
    for (n, p), q in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4, msg=n)


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_cached_decode_and_fast_decoder_equal_full_forward(name):
    """FastDecoder step == the model's cached step == the full forward (longrope: the cached keys keep the
    short factors they were written with once the sequence passes L0, as in transformers; so there the
    cached decode is compared with the fast one only)."""
    model = build(name)
    ids = torch.randint(0, 80, (2, 20), generator=torch.Generator().manual_seed(3))
    dec = FastDecoder(model)
    with torch.no_grad():
        full = model(ids)
        cache, fast_cache = model.new_kv_cache(2, 20), model.new_kv_cache(2, 20)
        steps = [model(ids[:, :7], kv_cache=cache)]
        model(ids[:, :7], kv_cache=fast_cache)
        for j in range(7, 20):
            steps.append(model(ids[:, j:j + 1], kv_cache=cache))
            got = dec.step(ids[:, j], torch.full((2,), j), None, fast_cache)
            torch.testing.assert_close(got, steps[-1][:, 0], rtol=1e-4, atol=1e-4)
        if "longrope" not in name:
            torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)


def test_gemma_features_are_wired():
    """Each Gemma feature changes the output (none is silently dropped) and the norms start at w = 0."""
    fresh = TransformerLM(ModelConfig(**BASE, **FEATURES["gemma"]))
    assert all(p.abs().sum() == 0 for n, p in fresh.named_parameters() if "norm" in n)
    ids = torch.randint(0, 80, (1, 12), generator=torch.Generator().manual_seed(4))
    base = build("gemma")
    with torch.no_grad():
        logits = base(ids)
        assert logits.abs().max() < 10.0  # final soft-cap
        for field, value in [("attn_softcap", None), ("final_softcap", None), ("embedding_multiplier", 1.0),
                             ("attn_scale", None), ("rope_local_base", None), ("sliding_window", 100)]:
            other = build("gemma", **{field: value})
            other.load_state_dict(base.state_dict())
            assert not torch.allclose(other(ids), logits, atol=1e-3), field


@pytest.mark.parametrize("bad,match", [
    (dict(attn_softcap=0.0), "attn_softcap must be a finite number > 0"),
    (dict(residual_multiplier=-1.0), "residual_multiplier must be a finite number > 0"),
    (dict(rope_local_base=1.0), "rope_local_base=1.0 must be a number > 1"),
    (dict(norm_unit_offset=True, norm="layernorm"), "norm_unit_offset=True needs norm='rmsnorm'"),
    (dict(qk_norm_scope="tensor"), "qk_norm_scope='tensor' is not one of"),
])
def test_bad_feature_fields_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{**BASE, **bad})
