"""FastDecoder on ggml blocks / bf16 weights computes the model whose matrices are those weights.

gguf: a model carrying `quantized_weights` (as a GGUF loader attaches them) whose parameters are the
blocks' dequantized values is decoded by "fast-gguf" exactly as by its own forward (same function,
fp32), tied head included. q8_0 / q4_1: the reference is the model with every matrix replaced by its
quantized-then-dequantized version, i.e. the exact math of the quantized model. bf16: the model with its norm
gains folded into the matrices that read them, then every matrix rounded to bf16 and run in fp32 (the
rounding "bf16" does), compared step by step over a KV cache.
"""

from __future__ import annotations

import copy

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.generate.engine import iter_decode
from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.generate.sampling import SamplingParams
from scratchlm.model import TransformerLM
from scratchlm.quant.dequantize import dequantize_blocks
from scratchlm.quant.quantize import quantize_blocks

PROMPTS = [[5, 9, 2, 77, 31, 8, 60], [40, 3], [3, 3, 100, 7]]
ROUND = {"q8_0": lambda w: dequantize_blocks(quantize_blocks(w, "Q8_0")),
         "q4_1": lambda w: dequantize_blocks(quantize_blocks(w, "Q4_1"))}


def model(tie: bool, seed: int = 0) -> TransformerLM:
    """A 2-layer GQA Llama (D 64, d_ff 192), random weights scaled so greedy tokens vary, random norm gains."""
    config = get_preset("llama-tiny", vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
                        max_seq_len=64, tie_embeddings=tie)
    torch.manual_seed(seed)
    m = TransformerLM(config).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0) if p.dim() == 2 else p.copy_(torch.rand(p.shape) + 0.5)
    return m


def rounded(m: TransformerLM, fmt: str) -> TransformerLM:
    """A copy of m with every matrix (embedding included) replaced by ROUND[fmt] of itself."""
    out = copy.deepcopy(m)
    with torch.no_grad():
        for p in out.parameters():
            if p.dim() == 2:
                p.copy_(ROUND[fmt](p))
    return out


def gguf_like(fmt: str = "q4_1") -> TransformerLM:
    """A tied model as a GGUF loader returns it: Q4_1 (or Q8_0) matrices, a Q8_0 embedding, fp32 params =
    the dequantized blocks, and model.quantized_weights."""
    m = model(tie=True)
    blocks = {}
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                b = quantize_blocks(p, "Q8_0" if "embed" in name or fmt == "q8_0" else "Q4_1")
                p.copy_(dequantize_blocks(b))
                blocks[name] = b
    m.quantized_weights = blocks
    return m


def assert_decodes_like(reference: TransformerLM, ours: TransformerLM, mode: str, atol: float) -> None:
    ref = list(iter_decode(reference, PROMPTS, 8, SamplingParams()))
    got = list(iter_decode(ours, PROMPTS, 8, SamplingParams(), decode=mode))
    for (tok_r, logits_r), (tok_g, logits_g) in zip(ref, got):
        torch.testing.assert_close(logits_g, logits_r, rtol=atol, atol=atol)
        assert torch.equal(tok_g, tok_r)
    assert len({t for tok, _ in ref for t in tok.tolist()}) > 3, "degenerate output makes this test weak"


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_gguf_mode_is_the_loaded_model_itself(fmt: str) -> None:
    m = gguf_like(fmt)
    dec = FastDecoder(m, quant="gguf")
    assert dec.head.blocks is m.quantized_weights["model.embed_tokens.weight"] or dec.head.blocks.ggml_type == "Q8_0"
    assert [p.ggml_type for p in dec.layers[0].qkv.parts] == [fmt.upper()] * 3  # q, k, v: each its own blocks
    assert_decodes_like(m, m, "fast-gguf", 1e-4)


def test_gguf_mode_without_blocks_is_the_fp32_decoder() -> None:
    m = model(tie=True)
    dec = FastDecoder(m, quant="gguf")
    assert all(lin.blocks is None and lin.quant is None for lin in dec.linears())
    assert_decodes_like(m, m, "fast-gguf", 1e-4)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_quantized_modes_compute_the_quantized_model(fmt: str) -> None:
    m = model(tie=False)
    # the decoder quantizes each matrix unfolded (norm gains stay on x), so the reference rounds the
    # model's own matrices (bf16 rounds the folded ones: test_bf16_mode_computes_the_folded_bf16_model)
    ref = rounded(m, fmt)
    with torch.no_grad():
        ref.model.embed_tokens.weight.copy_(m.model.embed_tokens.weight)  # lookups stay fp32
    dec = FastDecoder(m, quant=fmt)
    # the engine prefills through the model; compare the steps on one cache prefilled by the reference
    ids = torch.tensor(PROMPTS[:1])
    c_ref, c_dec = ref.new_kv_cache(1, 32), ref.new_kv_cache(1, 32)
    tokens = set()
    with torch.no_grad():
        ref(ids, kv_cache=c_ref)
        ref(ids, kv_cache=c_dec)
        tok = ids[:, -1]
        for s_ in range(ids.shape[1], ids.shape[1] + 8):
            pos = torch.full((1,), s_)
            want = ref(tok[:, None], pos[:, None], kv_cache=c_ref)[:, -1]
            got = dec.step(tok, pos, None, c_dec)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            tok = want.argmax(-1)
            tokens.add(int(tok))
    assert len(tokens) > 3, "degenerate output makes this test weak"


def bf16_folded(m: TransformerLM) -> TransformerLM:
    """A copy of the plain Llama m computing its math with bf16 matrices the way "bf16" stores them: each RMSNorm
    gain g folded into the matrices that read it (W diag(g), in fp32; the gain then 1), then every matrix but the
    embedding (looked up in fp32) rounded to bf16 and run in fp32. The decoder also folds 1/sqrt(Hd) into the q
    rows before rounding; Hd = 16 makes that 1/4, a power of two, which commutes with rounding exactly."""
    assert m.config.head_dim == 16 and m.config.norm == "rmsnorm" and not m.config.tie_embeddings
    out = copy.deepcopy(m)
    reads = [(layer.input_layernorm, [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj])
             for layer in out.model.layers]
    reads += [(layer.post_attention_layernorm, [layer.mlp.gate_proj, layer.mlp.up_proj]) for layer in out.model.layers]
    reads += [(out.model.norm, [out.lm_head])]
    with torch.no_grad():
        for norm, linears in reads:
            for lin in linears:
                lin.weight.mul_(norm.weight[None, :])  # (out, in) * g over in
            norm.weight.fill_(1.0)
        for name, p in out.named_parameters():
            if p.dim() == 2 and name != "model.embed_tokens.weight":
                p.copy_(p.to(torch.bfloat16).float())
    return out


@pytest.mark.parametrize("batch", [1, 3])
def test_bf16_mode_computes_the_folded_bf16_model(batch: int) -> None:
    m = model(tie=False)
    ref = bf16_folded(m)
    dec = FastDecoder(m, quant="bf16")
    ids = torch.randint(0, 128, (batch, 6), generator=torch.Generator().manual_seed(0))
    c_ref, c_dec = ref.new_kv_cache(batch, 32), ref.new_kv_cache(batch, 32)
    tokens = set()
    with torch.no_grad():
        ref(ids, kv_cache=c_ref)  # the engine prefills through the model: one prefill, the steps compared
        ref(ids, kv_cache=c_dec)
        tok = ids[:, -1]
        for s_ in range(6, 14):
            pos = torch.full((batch,), s_)
            want = ref(tok[:, None], pos[:, None], kv_cache=c_ref)[:, -1]
            got = dec.step(tok, pos, None, c_dec)
            # measured max |got - want| 8.3e-7 (|logits| <= 2.2; seeds 0-2, B 1 and 3, this test and the
            # engine's below, with and without the C++ kernels): fp32 summation order only. Rounding the
            # unfolded W instead (round(W) diag(g)) differs by 7e-3 to 8e-3, so 1e-5 tells the two apart.
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            tok = want.argmax(-1)
            tokens.update(tok.tolist())
    torch.testing.assert_close(c_dec.k, c_ref.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_dec.v, c_ref.v, rtol=1e-5, atol=1e-5)
    assert len(tokens) > 3, "degenerate output makes this test weak"


def test_engine_fast_bf16_steps_the_folded_bf16_model() -> None:
    """decode="fast-bf16" in the engine: the prompt through the fp32 model, then every step the bf16 model's."""
    m = model(tie=False)
    ref = bf16_folded(m)
    prompt = PROMPTS[0]
    got = list(iter_decode(m, [prompt], 8, SamplingParams(), decode="fast-bf16"))
    cache = m.new_kv_cache(1, len(prompt) + 8)
    with torch.no_grad():
        want = m(torch.tensor([prompt]), kv_cache=cache)[:, -1]
        for i, (tok, logits) in enumerate(got):
            torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)  # as above
            assert torch.equal(tok, want.argmax(-1))
            want = ref(tok[:, None], torch.tensor([[len(prompt) + i]]), kv_cache=cache)[:, -1]
    assert len({int(t) for t, _ in got}) > 3, "degenerate output makes this test weak"


def test_q_modes_reuse_the_models_own_blocks_of_that_type() -> None:
    m = gguf_like("q4_1")
    q4 = FastDecoder(m, quant="q4_1")
    own = m.quantized_weights["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(q4.layers[0].down.blocks.data, own.data)
    assert q4.head.blocks.ggml_type == "Q4_1"  # the Q8_0 embedding is re-quantized for this mode
    q8 = FastDecoder(m, quant="q8_0")
    assert torch.equal(q8.head.blocks.data, m.quantized_weights["model.embed_tokens.weight"].data)


def test_block_modes_refuse_dims_that_are_not_multiples_of_32() -> None:
    config = get_preset("llama-tiny", vocab_size=64, d_model=48, n_layers=1, n_heads=4, max_seq_len=32)
    with pytest.raises(ValueError, match=r"fast-q4_1.*multiples of 32.*'d_model': 48"):
        FastDecoder(TransformerLM(config), quant="q4_1")
