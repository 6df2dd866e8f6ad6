"""FastDecoder (packed weights, fewer ops) computes the model's own cached decode step.

Reference: the model's forward over the same KV cache (itself tested against HF and a full forward).
int8: checked against the model with every matrix replaced by its dequantized int8 version.
"""

from __future__ import annotations

import pytest
import torch

from gen_helpers import build, small_config
from scratchlm.config import ModelConfig
from scratchlm.generate import generate
from scratchlm.generate.decode_step import fast_decoder, make_decode_step
from scratchlm.generate.engine import iter_decode
from scratchlm.generate.fast_decode import FastDecoder, PackedLinear, mkl_packing_available, quantize_int8
from scratchlm.nn.rope import rope_rotation
from scratchlm.generate.sampling import SamplingParams
from scratchlm.model import TransformerLM

PROMPTS = [[5, 9, 2, 77, 31, 8, 60], [40], [3, 3, 100, 7]]


def with_random_norms(model: TransformerLM, seed: int = 1) -> TransformerLM:
    """Norm gains/biases away from 1/0 so folding them into the matrices is actually exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5 if name.endswith("weight") else torch.randn(p.shape, generator=g) * 0.1)
    return model


CONFIGS = {
    "llama-gqa-half": small_config("llama-gqa-half"),
    "llama-gqa-interleaved": small_config("llama-gqa-interleaved"),
    "llama-mha": small_config("llama-mha"),
    "llama-mqa-sdpa": small_config("llama-mqa").replace(attn_impl="sdpa"),
    "gpt2-tiny": small_config("gpt2-tiny"),
    "qwen-like": small_config("llama-gqa-half").replace(qkv_bias=True, qk_norm=True, tie_embeddings=False),
    "sinusoidal-gelu": ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=64,
                                   pos_embedding="sinusoidal", ffn="mlp", activation="gelu", norm="layernorm"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_step_logits_equal_model_cached_forward(name: str) -> None:
    model = with_random_norms(build(CONFIGS[name], scale=2.0))
    dec = FastDecoder(model)
    b, p = 3, 6
    ids = torch.randint(0, 128, (b, p), generator=torch.Generator().manual_seed(0))
    ref_cache, fast_cache = model.new_kv_cache(b, 32), model.new_kv_cache(b, 32)
    with torch.no_grad():
        model(ids, kv_cache=ref_cache)
        model(ids, kv_cache=fast_cache)
        tok = ids[:, -1]
        for s in range(p, p + 8):
            pos = torch.full((b,), s)
            ref = model(tok[:, None], pos[:, None], kv_cache=ref_cache)[:, -1]
            got = dec.step(tok, pos, None, fast_cache)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            tok = ref.argmax(-1)
    torch.testing.assert_close(fast_cache.k, ref_cache.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_cache.v, ref_cache.v, rtol=1e-5, atol=1e-5)


def test_rope_rotation_matrix_is_the_pairing_rotation() -> None:
    x = torch.randn(5, 8)
    a, b = x[:, :4], x[:, 4:]
    assert torch.equal(x @ rope_rotation(8, "half", torch.float32), torch.cat((-b, a), -1))
    inter = torch.stack((-x[:, 1::2], x[:, 0::2]), -1).flatten(-2)
    assert torch.equal(x @ rope_rotation(8, "interleaved", torch.float32), inter)


@pytest.mark.parametrize("variant", ["llama-gqa-half", "llama-sdpa", "gpt2-tiny"])
def test_engine_fast_equals_model_decode_batched_left_padded(variant: str) -> None:
    model = with_random_norms(build(small_config(variant).replace(tie_embeddings=False), scale=3.0))
    ref = list(iter_decode(model, PROMPTS, 10, SamplingParams()))
    fast = list(iter_decode(model, PROMPTS, 10, SamplingParams(), decode="fast"))
    for (tok_r, logits_r), (tok_f, logits_f) in zip(ref, fast):
        assert torch.equal(tok_r, tok_f)
        torch.testing.assert_close(logits_f, logits_r, rtol=1e-5, atol=1e-5)
    assert len({t for tok, _ in ref for t in tok.tolist()}) > 3, "degenerate output makes this test weak"


def test_bf16_model_close_to_model_step() -> None:
    model = with_random_norms(build(small_config("llama-gqa-half"), scale=2.0)).to(torch.bfloat16)
    ref = list(iter_decode(model, PROMPTS[:1], 4, SamplingParams()))
    fast = list(iter_decode(model, PROMPTS[:1], 4, SamplingParams(), decode="fast"))
    for (_, logits_r), (_, logits_f) in zip(ref, fast):
        torch.testing.assert_close(logits_f, logits_r, rtol=0.05, atol=0.05 * logits_r.abs().max().item())


def test_quantize_int8_per_row_scale_and_range() -> None:
    w = torch.randn(16, 32) * torch.logspace(-3, 1, 16)[:, None]
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    torch.testing.assert_close(s, w.abs().amax(1) / 127)
    assert bool(((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-7).all())  # round-to-nearest


def test_int8_step_equals_model_with_dequantized_weights() -> None:
    model = with_random_norms(build(small_config("llama-gqa-half").replace(tie_embeddings=False), scale=2.0))
    dec = FastDecoder(model, quant="int8")
    # The reference: the plain (fp32) FastDecoder on the dequantized matrices, each of which is checked
    # to be exactly q * s; then the int8 kernel's logits must match it up to its bf16 activations.
    ref_dec = FastDecoder(model)
    for fast_l, ref_l in zip(dec.layers, ref_dec.layers):
        for name in ("qkv", "o", "ffn_in", "down"):
            packed_q, packed_f = getattr(fast_l, name), getattr(ref_l, name)
            q, s = quantize_int8(packed_f.w)
            assert torch.equal(packed_q.q, q)
            packed_f.w = q.float() * s.to(torch.bfloat16).float()[:, None]
    q, s = quantize_int8(ref_dec.head.w)
    ref_dec.head.w = q.float() * s.to(torch.bfloat16).float()[:, None]
    ids = torch.tensor([PROMPTS[0]])
    c_ref, c_q = model.new_kv_cache(1, 32), model.new_kv_cache(1, 32)
    with torch.no_grad():
        model(ids, kv_cache=c_ref)
        model(ids, kv_cache=c_q)
        tok = ids[:, -1]
        for s_ in range(7, 12):
            pos = torch.full((1,), s_)
            ref = ref_dec.step(tok, pos, None, c_ref)
            got = dec.step(tok, pos, None, c_q)
            assert (got - ref).abs().max() <= 0.02 * ref.abs().max()
            tok = ref.argmax(-1)
    # each dequantized row is within one quantization step (s, bf16-rounded) of the folded fp32 row
    folded = model.lm_head.weight * model.model.norm.weight  # (V, D): the final norm's gain folded in
    step = folded.abs().amax(1, keepdim=True) / 127
    assert bool(((dec.head.dequantized() - folded).abs() <= step).all())


def test_packed_decoder_cached_and_rebuilt_after_weight_update() -> None:
    model = build(small_config("llama-gqa-half").replace(tie_embeddings=False), scale=3.0)
    first = fast_decoder(model)
    assert fast_decoder(model) is first
    before = generate(model, PROMPTS, 6, decode="fast")
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # a training step happened
    assert fast_decoder(model) is not first
    assert generate(model, PROMPTS, 6, decode="fast") == generate(model, PROMPTS, 6) != before


def test_post_norm_falls_back_and_bad_modes_error() -> None:
    model = build(small_config("llama-gqa-half").replace(norm_placement="post"), scale=3.0)
    with pytest.raises(ValueError, match="pre-norm"):
        FastDecoder(model)
    assert generate(model, PROMPTS, 5, decode="fast") == generate(model, PROMPTS, 5)
    with pytest.raises(ValueError, match="unknown decode mode 'turbo'"):
        make_decode_step(model, "turbo")
    with pytest.raises(ValueError, match="unknown quant"):
        FastDecoder(build(small_config("llama-mha")), quant="int4")
    odd = build(ModelConfig(vocab_size=100, d_model=40, n_layers=1, n_heads=2, max_seq_len=32))
    with pytest.raises(ValueError, match=r"multiples of 16 .*'d_model': 40.*use decode='fast'"):
        generate(odd, [[1, 2, 3]], 4, decode="fast-int8")  # torch's kernel would crash or be wrong


@pytest.mark.skipif(not mkl_packing_available(), reason="torch built without MKL")
def test_mkl_packed_gemm_for_a_fixed_batch_equals_linear() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    lin = PackedLinear(w, b, torch.float32, None)
    lin.pack_for_batch(4)
    assert lin.mkl is not None and lin.mkl[0] == 4
    for rows in (4, 3, 1):  # the packed size, then sizes that take the plain path
        x = torch.randn(rows, 32, generator=g)
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
