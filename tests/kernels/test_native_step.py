"""The C++ decode step (generate/native_step.py) == FastDecoder's torch step, every supported variant.

Reference: FastDecoder.step with its native step switched off (itself tested against the model's
forward in tests/generate/test_fast_decode.py) on the same packed weights; both start from one cache
prefilled by the model; logits and the written cache slots must agree to fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.kernels.build import native
from scratchlm.model import TransformerLM
from scratchlm.quant.dequantize import dequantize_blocks
from scratchlm.quant.quantize import quantize_blocks

pytestmark = pytest.mark.skipif(native() is None, reason="no C++ compiler: the torch step is the only path")

VARIANTS = {
    "gqa-half": dict(n_kv_heads=2, rope_style="half"),
    "gqa-interleaved-untied": dict(n_kv_heads=2, rope_style="interleaved", tie_embeddings=False),
    "mha-qkv-bias": dict(n_kv_heads=4, qkv_bias=True),
    "mqa": dict(n_kv_heads=1),
    "qk-norm-head": dict(n_kv_heads=2, qk_norm=True),  # Qwen3
    # OLMo-2: no input norms, output norms on both sublayers, QK-norm over the whole projections
    "olmo2": dict(n_kv_heads=2, qk_norm=True, qk_norm_scope="projection", norm_placement="output",
                  tie_embeddings=False),
    # Gemma-3: GeGLU (tanh GELU), (1 + w) norms in sandwich placement, QK-norm, sqrt(D) embedding multiplier,
    # local RoPE base on the sliding layers, a final softcap
    "gemma3": dict(n_kv_heads=2, ffn="glu", activation="gelu_tanh", norm_unit_offset=True, norm_placement="sandwich",
                   qk_norm=True, embedding_multiplier=8.0, rope_base=1e6, rope_local_base=1e4, sliding_window=4,
                   layer_types=("sliding_attention", "full_attention"), final_softcap=3.0),
    # Gemma-2: attention and final soft-capping (small caps so they bite), its own attention scale
    "gemma2": dict(n_kv_heads=2, ffn="glu", activation="gelu_tanh", norm_placement="sandwich", attn_softcap=2.0,
                   final_softcap=3.0, attn_scale=0.2, embedding_multiplier=8.0),
    # Granite's multipliers; a NoPE layer (SmolLM3) and exact-GELU gate
    "granite-nope": dict(n_kv_heads=2, embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=4.0,
                         nope_layers=(1,), ffn="glu", activation="gelu"),
    # mixtures of experts (kernels/csrc/moe_layer.h): Qwen3-MoE's router (softmax, top-k, renormalised) with
    # QK-norm; Mixtral's (top-k of the logits, then softmax) with a dense FFN in layer 1; Qwen-MoE's softmax
    # without renormalising, one expert per token
    "moe-softmax-topk": dict(n_kv_heads=2, qk_norm=True, moe_num_experts=8, moe_top_k=3, moe_d_ff=48),
    "moe-topk-softmax-dense-layer": dict(n_kv_heads=2, moe_num_experts=4, moe_top_k=2, moe_router="topk_softmax",
                                         moe_dense_layers=(1,), tie_embeddings=False),
    "moe-unnormalised-top1": dict(n_kv_heads=1, moe_num_experts=4, moe_top_k=1, moe_norm_topk_prob=False),
    "moe-shared-expert": dict(n_kv_heads=2, moe_num_experts=4, moe_top_k=2, moe_norm_topk_prob=False,
                              moe_shared_d_ff=48),  # Qwen2-MoE: + sigmoid(w_s . x) SharedFFN(x)
    "sliding-window-yarn": dict(n_kv_heads=2, sliding_window=4, layer_types=("sliding_attention", "full_attention"),
                                rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 24}),
}


def model(**kw) -> TransformerLM:
    config = get_preset("llama-tiny", vocab_size=96, d_model=64, n_layers=2, n_heads=4, d_ff=160, max_seq_len=48,
                        **kw)
    torch.manual_seed(0)
    m = TransformerLM(config).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(2.0) if p.dim() == 2 else p.add_(torch.rand(p.shape))
    return m


def compare(m: TransformerLM, quant: str | None, b: int = 2, padded: bool = False, rel: float = 0.0) -> None:
    """rel > 0: logits within rel * max |logit| (besides rtol 2e-5): gemv_fixed24.h's rounding of x moves by a step
    where the two steps' x differ by an ulp (tests/kernels/test_fixed24.py bounds it against float64)."""
    fast, ref = FastDecoder(m, quant=quant), FastDecoder(m, quant=quant)
    assert fast.native is not None
    ref.native = None
    ids = torch.randint(0, 96, (b, 5), generator=torch.Generator().manual_seed(1))
    caches = [m.new_kv_cache(b, 16), m.new_kv_cache(b, 16)]
    mask = torch.ones(b, 16, dtype=torch.bool)
    if padded:
        mask[0, :2] = False  # row 0 left-padded by two slots
    with torch.no_grad():
        for c in caches:
            m(ids, kv_cache=c)
        tok = ids[:, -1]
        for s in range(5, 10):
            pos = torch.full((b,), s)
            key_mask = mask[:, : s + 1] if padded else None
            want = ref.step(tok, pos, key_mask, caches[0])
            got = fast.step(tok, pos, key_mask, caches[1])
            torch.testing.assert_close(got, want, rtol=2e-5, atol=max(2e-5, rel * float(want.abs().max())))
            tok = want.argmax(-1)
    # fp32 summation order differs between the C++ kernels (AVX2 or AVX-512 lanes) and torch's, and the
    # difference grows over the layers and steps that wrote the cache: a few ulps of values ~0.05-1
    torch.testing.assert_close(caches[1].k, caches[0].k, rtol=1e-4, atol=5e-5)
    torch.testing.assert_close(caches[1].v, caches[0].v, rtol=1e-4, atol=5e-5)
    assert caches[1].seq_len == caches[0].seq_len == 10


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_native_step_equals_torch_step_fp32(variant: str) -> None:
    compare(model(**VARIANTS[variant]), None)


@pytest.mark.parametrize("variant", sorted(v for v in VARIANTS if v.startswith("moe")))
def test_native_step_one_row_moe(variant: str) -> None:
    """One row per step: moe_layer.h's one-row path (every chosen expert's gate|up in one parallel region, their
    downs in a second) equals the torch step as the batched path does."""
    compare(model(**VARIANTS[variant]), None, b=1)


@pytest.mark.parametrize("quant", ["bf16", "q8_0", "q4_1", "q8_0_a8", "q4_1_a8"])
@pytest.mark.parametrize("b", [1, 3])  # one row and a batch take different kernel tiles
def test_native_step_equals_torch_step_weight_formats(quant: str, b: int) -> None:
    compare(model(n_kv_heads=2, tie_embeddings=False), quant, b=b, padded=b > 1)


def on_blocks(m: TransformerLM) -> TransformerLM:
    """m with its matrices rounded to ggml blocks (Q8_0 embedding, Q4_1 elsewhere), kept as its GGUF blocks."""
    blocks = {}
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                blocks[name] = quantize_blocks(p, "Q8_0" if "embed" in name else "Q4_1")
                p.copy_(dequantize_blocks(blocks[name]))
    m.quantized_weights = blocks
    return m


@pytest.mark.parametrize("b", [1, 2])
def test_native_step_on_gguf_blocks(b: int) -> None:
    compare(on_blocks(model(n_kv_heads=2)), "gguf", b=b, padded=b > 1)


def test_unsupported_configs_keep_the_torch_step() -> None:
    assert FastDecoder(model(n_kv_heads=2, ffn="mlp", activation="gelu")).native is None  # no gated FFN
    assert FastDecoder(model(n_kv_heads=2, ffn="glu", activation="relu")).native is None
    assert FastDecoder(model(n_kv_heads=2, moe_num_experts=4, residual_multiplier=0.5)).native is None  # MoE * m
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 24}
    assert FastDecoder(model(n_kv_heads=2, rope_scaling=dynamic)).native is None
    assert FastDecoder(model(n_kv_heads=2), quant="int8").native is None
    gpt2 = get_preset("gpt2-tiny", vocab_size=96, d_model=64, n_layers=1, n_heads=4, max_seq_len=32)
    assert FastDecoder(TransformerLM(gpt2)).native is None


@pytest.mark.parametrize("kw", [dict(n_kv_heads=1), dict(n_kv_heads=2, sliding_window=300),
                                dict(n_kv_heads=4, attn_softcap=2.0)])
def test_native_step_over_a_long_cache_splits_the_keys(kw) -> None:
    """Past KEY_SPAN_MIN (256) cached keys the C++ attention splits each (token, KV head)'s keys into spans
    over the threads and merges their partial softmaxes; 1000 cached tokens (4 spans for MQA), a window of 300
    (2 spans), soft-capping (8 items, one span each), left padding on one row: logits equal the torch step's."""
    config = get_preset("llama-tiny", vocab_size=96, d_model=64, n_layers=2, n_heads=4, d_ff=160, max_seq_len=1100,
                        **kw)
    torch.manual_seed(0)
    m = TransformerLM(config).eval()
    fast, ref = FastDecoder(m), FastDecoder(m)
    assert fast.native is not None
    ref.native = None
    b, n = 2, 1000
    ids = torch.randint(0, 96, (b, n), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(b, 1100, dtype=torch.bool)
    mask[1, :40] = False  # row 1 left-padded by 40 slots
    cache = m.new_kv_cache(b, 1100)
    with torch.no_grad():
        m(ids, attention_mask=mask[:, :n], kv_cache=cache)
    caches = [cache, m.new_kv_cache(b, 1100)]
    caches[1].k.copy_(cache.k), caches[1].v.copy_(cache.v), caches[1].advance(n)
    tok = ids[:, -1]
    threads = torch.get_num_threads()
    torch.set_num_threads(4)  # the split follows the threads: 4 gives MQA 4 spans, the window 2 (KV heads x rows < 8)
    try:
        for s in range(n, n + 3):
            pos = torch.full((b,), s) - torch.tensor([0, 40])
            want = ref.step(tok, pos, mask[:, : s + 1], caches[0])
            got = fast.step(tok, pos, mask[:, : s + 1], caches[1])
            torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
            tok = want.argmax(-1)
    finally:
        torch.set_num_threads(threads)


def test_native_step_longrope_with_partial_rotary() -> None:
    """Phi-3.5 / Phi-4-mini: longrope (short tables up to L0 = 8 positions, long tables for a step whose position
    passes it) on the first 12 of 16 head dims. The steps at positions 5..9 cross L0: logits and cache equal to
    the torch step's on both sides of the switch."""
    longrope = {"rope_type": "longrope", "original_max_position_embeddings": 8,
                "short_factor": [1.0 + 0.1 * i for i in range(6)], "long_factor": [1.0 + 0.7 * i for i in range(6)]}
    m = model(n_kv_heads=2, rotary_dim=12, rope_scaling=longrope)
    rope = FastDecoder(m).rope
    assert rope.kind == "longrope" and rope.head_dim == 12 < m.config.head_dim
    assert not torch.equal(rope.cos_long[9], rope.cos[9])  # the switch changes the rotation
    compare(m, None)
