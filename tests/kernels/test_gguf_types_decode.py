"""decode="fast-gguf" runs a GGUF-like model's own blocks of every type, mixed within one stacked matrix.

The model carries `quantized_weights` written by llama.cpp's quantizer in a different type per matrix (every
block type and F16 appear; one matrix has no blocks and runs its fp32 weight), its parameters the blocks'
dequantized values, as load_gguf returns it. References: the C++ LlamaStep against FastDecoder's torch step
on the same packed parts (tests/kernels/test_native_step.py's `compare`), the engine's fast-gguf decode
against the model's own forward (greedy tokens equal, logits to fp32 rounding), with and without the
compiled kernels (the pure-torch fallback: F.linear on the dequantized parts).
"""

from __future__ import annotations

import copy

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.kernels import ops
from scratchlm.kernels.build import native
from scratchlm.model import TransformerLM
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import dequantize_blocks
from tests.kernels.test_block_decode import assert_decodes_like
from tests.kernels.test_native_step import compare
from tests.quant.ggml_c_lib import quantize as c_quantize

# per layer: q, k, v, o, gate, up, down (None: no blocks, the fp32 weight); the tied embedding / head Q6_K
LAYER_TYPES = [("Q4_K", "Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS"),
               ("Q4_0", None, "IQ4_NL", "Q8_0", "Q4_1", "Q5_0", "F16"),
               ("Q5_1", "Q5_1", "BF16", "Q6_K", "Q4_K", "Q4_K", "Q8_0")]
NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")


def blocks_of(w: torch.Tensor, type_name: str) -> GGMLBlocks:
    if type_name in ("F16", "BF16"):
        data = w.to(torch.float16 if type_name == "F16" else torch.bfloat16).contiguous().view(torch.uint8)
    else:
        data = torch.from_numpy(c_quantize(w.detach().float().numpy(), type_name))
    return GGMLBlocks(type_name, data, (w.shape[0], w.shape[1]))


def gguf_model(n_layers: int = 3) -> TransformerLM:
    """Widths 256 / 512 (whole K-quant super-blocks), vocab 128; random weights scaled so tokens vary."""
    config = get_preset("llama-tiny", vocab_size=128, d_model=256, n_layers=n_layers, n_heads=4, n_kv_heads=2,
                        d_ff=512, max_seq_len=48)
    torch.manual_seed(0)
    m = TransformerLM(config).eval()
    types = {"model.embed_tokens.weight": "Q6_K"}
    for i in range(n_layers):
        types.update({f"model.layers.{i}.{name}.weight": t for name, t in zip(NAMES, LAYER_TYPES[i])})
    blocks = {}
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2:
                p.mul_(6.0)
            else:
                p.add_(torch.rand(p.shape))
            if types.get(name) is not None:
                blocks[name] = blocks_of(p, types[name])
                p.copy_(dequantize_blocks(blocks[name]))
    m.quantized_weights = blocks
    return m


def test_stacked_matrices_keep_each_parts_type() -> None:
    """Each linear is its own part, in its own type, and the model's own block bytes (no copy: a mapped file's
    pages stay the only copy of the weights)."""
    m = gguf_model()
    dec = FastDecoder(m, quant="gguf")
    kinds = [[tuple(p.ggml_type for p in lin.parts) for lin in (l.qkv, l.o, l.ffn_in, l.down)] for l in dec.layers]
    assert kinds == [[("Q4_K", "Q4_K", "Q6_K"), ("Q5_K",), ("Q3_K", "Q2_K"), ("IQ4_XS",)],
                     [("Q4_0", "F32", "IQ4_NL"), ("Q8_0",), ("Q4_1", "Q5_0"), ("F16",)],
                     [("Q5_1", "Q5_1", "BF16"), ("Q6_K",), ("Q4_K", "Q4_K"), ("Q8_0",)]]
    assert [p.ggml_type for p in dec.head.parts] == ["Q6_K"]
    own = {b.data.data_ptr() for b in m.quantized_weights.values()}
    for layer in dec.layers:
        for lin in (layer.qkv, layer.o, layer.ffn_in, layer.down):
            assert all(p.data.data_ptr() in own for p in lin.parts if p.ggml_type != "F32")


@pytest.mark.skipif(native() is None, reason="no C++ compiler: the torch step is the only path")
@pytest.mark.parametrize("fixed24", [True, False])
@pytest.mark.parametrize("b", [1, 3])
def test_native_step_on_mixed_gguf_types(b: int, fixed24: bool) -> None:
    """fixed24: one batch row of the K-quants through gemv_fixed24.h / gemv_fixed24_avx2.h where built (the default;
    x rounded to 24 bits per 32 values: logits within 1e-5 of their largest, measured 4e-6), else the fp32 kernels
    (within 2e-5)."""
    m = gguf_model()
    assert FastDecoder(m, quant="gguf").native is not None
    mod = native()
    before = mod.set_fixed24(fixed24)
    try:
        compare(m, "gguf", b=b, padded=b > 1, rel=1e-5 if fixed24 and mod.fixed24_types() else 0.0)
    finally:
        mod.set_fixed24(before)


@pytest.mark.parametrize("native_on", [True, False])
def test_fast_gguf_decodes_the_loaded_model(monkeypatch, native_on: bool) -> None:
    """The engine's fast-gguf decode (C++ step, or the torch step on the fallback) == the model itself."""
    if native_on and native() is None:
        pytest.skip("no native kernels on this machine")
    if not native_on:
        monkeypatch.setattr(ops, "native_kernels", lambda: None)
    m = gguf_model()
    dec = FastDecoder(m, quant="gguf")
    assert (dec.native is not None) == native_on
    assert all((lin.fallback is None) == native_on for lin in dec.linears())
    # measured max |logit difference| ~2e-6 (|logits| up to ~10): fp32 summation order only
    assert_decodes_like(m, m, "fast-gguf", 5e-5)


def on_block_layers(m: TransformerLM) -> TransformerLM:
    """m with every matrix that has blocks (the tied head too) an nn/block_linear.py BlockLinear holding them, as
    load_gguf builds a model on its blocks, and no `quantized_weights`."""
    from scratchlm.nn.block_linear import BlockLinear

    out = copy.deepcopy(m)
    blocks = out.__dict__.pop("quantized_weights")
    for name, mod in list(out.named_modules()):
        key = ("model.embed_tokens" if name == "lm_head" else name) + ".weight"
        if key in blocks and "embed" not in name and getattr(mod, "weight", None) is not None:
            parent, _, child = name.rpartition(".")
            bias = None if getattr(mod, "bias", None) is None else mod.bias.detach()
            setattr(out.get_submodule(parent) if parent else out, child, BlockLinear(blocks[key], bias))
    return out


def test_fast_gguf_packs_block_layers_own_blocks() -> None:
    """A model built on its blocks (BlockLinear layers, no quantized_weights): fast-gguf packs their own blocks
    (never their dequantized weights) and decodes like the model with those weights dequantized."""
    m = gguf_model()
    blk = on_block_layers(m)
    assert not hasattr(blk, "quantized_weights") and type(blk.lm_head).__name__ == "BlockLinear"
    dec = FastDecoder(blk, quant="gguf")
    assert [[p.ggml_type for p in lin.parts] for lin in (dec.layers[0].qkv, dec.layers[1].qkv, dec.head)] == \
        [["Q4_K", "Q4_K", "Q6_K"], ["Q4_0", "F32", "IQ4_NL"], ["Q6_K"]]
    assert all(lin.parts for lin in dec.linears())
    assert_decodes_like(m, blk, "fast-gguf", 5e-5)


def block_model(m: TransformerLM, embed_type: str) -> TransformerLM:
    """m with every matrix that has blocks (and the embedding, re-encoded in embed_type) replaced by block
    layers over those bytes, as load_gguf(dtype=None) builds a GGUF model: no fp32 matrix, a tied head
    reading the embedding's blocks (an F16 / BF16 table: the head keeps m's Q6_K blocks)."""
    from scratchlm.nn.block_embedding import BlockEmbedding
    from scratchlm.nn.block_linear import BlockLinear

    bm = copy.deepcopy(m)
    blocks = dict(m.quantized_weights)
    blocks["model.embed_tokens.weight"] = blocks_of(m.model.embed_tokens.weight, embed_type)
    del bm.quantized_weights
    for name, b in blocks.items():
        parent, _, child = name.removesuffix(".weight").rpartition(".")
        layer = BlockEmbedding(b) if "embed_tokens" in name else BlockLinear(b)
        setattr(bm.get_submodule(parent), child, layer)
    head = blocks["model.embed_tokens.weight"]
    if embed_type in ("F16", "BF16"):  # a dense head sums in another order than the torch step: keep blocks there
        head = m.quantized_weights["model.embed_tokens.weight"]
    bm.lm_head = BlockLinear(head)
    return bm.eval()


@pytest.mark.skipif(native() is None, reason="no C++ compiler: the torch step is the only path")
@pytest.mark.parametrize("embed_type", ["Q6_K", "Q8_0", "Q4_K", "F16", "BF16"])
def test_native_step_reads_a_block_embedding_table(embed_type: str) -> None:
    """On a model built on blocks the decoder keeps the embedding table in its blocks (no fp32 copy) and the
    C++ step widens the looked-up rows itself, exactly: bit for bit the step of the same model holding the
    dequantized table as a plain fp32 Embedding (same kernels otherwise), and to fp32 rounding the torch step."""
    from scratchlm.nn.block_embedding import BlockEmbedding
    from scratchlm.nn.embedding import Embedding

    bm = block_model(gguf_model(), embed_type)
    dense = copy.deepcopy(bm)
    table = Embedding(*bm.model.embed_tokens.blocks.shape)
    with torch.no_grad():
        table.weight.copy_(bm.model.embed_tokens.weight)
    dense.model.embed_tokens = table
    dec, ref = FastDecoder(bm, quant="gguf"), FastDecoder(dense, quant="gguf")
    assert isinstance(dec.embed, BlockEmbedding) and dec.native is not None and ref.native is not None
    ids = torch.tensor([[5, 9, 17, 3], [1, 2, 3, 4]])
    caches = [bm.new_kv_cache(2, 16), dense.new_kv_cache(2, 16)]
    with torch.no_grad():
        for c in caches:
            bm(ids, kv_cache=c)
        tok = ids[:, -1]
        for s in range(4, 9):
            pos = torch.full((2,), s)
            got, want = dec.step(tok, pos, None, caches[0]), ref.step(tok, pos, None, caches[1])
            assert torch.equal(got, want)
            tok = want.argmax(-1)
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
    if embed_type not in ("F16", "BF16"):  # two batch rows read the copies (Q4_K / Q3_K / Q2_K) through gemv_r16.h
        compare(bm, "gguf", b=2, rel=1e-5 if native().has_fixed24() else 0.0)
