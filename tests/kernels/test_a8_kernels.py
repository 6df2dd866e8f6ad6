"""The A8 formats (Q8_0 / Q4_1 weights x activations rounded to 8 bits per 32-block) compute their definition.

Definition (quant/act_quant.py): y = (d q) @ W^T, (q, d) the per-block int8 rounding of x, W the
dequantized blocks. References: the activation rounding against gguf-py's Q8_0 quantizer (ggml's own
reference rounding of a row to Q8_0 blocks); the C++ kernels (integer block sums, VNNI where present) and
the pure-torch fallback against float64 `(d q) @ W^T` with W = gguf-py's dequantization; a whole decoder
in fast-q8_0-a8 / fast-q4_1-a8 against the model itself whose every matrix is the dequantized blocks and
reads round_act of its input (forward pre-hooks): the same math written with torch modules.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from scratchlm.generate import packed_linear
from scratchlm.generate.fast_decode import FastDecoder
from scratchlm.generate.packed_linear import PackedLinear
from scratchlm.kernels import ops
from scratchlm.kernels.build import native
from scratchlm.quant.act_quant import dequantize_act, quantize_act, round_act
from scratchlm.quant.dequantize import dequantize_blocks
from scratchlm.quant.quantize import quantize_blocks
from tests.kernels.test_block_decode import PROMPTS, model




def activations(b: int, k: int, seed: int = 0) -> torch.Tensor:
    """Rows of very different scales, plus an all-zero block and a block of ties (amax = 127, so
    x * 127 / amax = x, and the others are k + 0.5)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, k, generator=g) * torch.logspace(-3, 2, b)[:, None]
    x[0, :32] = 0.0
    x[-1, 32:64] = torch.cat((torch.tensor([127.0]), torch.arange(31) - 15.5))
    return x


def test_act_rounding_is_ggml_q8_0_of_the_activations() -> None:
    """d = gguf-py's Q8_0 block scale (fp16 there, fp32 here); q equal but at ties, which ggml's scalar
    reference rounds away from zero and we (like ggml's AVX kernels) to even."""
    x = activations(6, 256)
    q, d = quantize_act(x)
    raw = quantize(x.numpy(), GGMLQuantizationType.Q8_0).reshape(6, 8, 34)
    d_ref = raw[..., :2].copy().view(np.float16)[..., 0]
    q_ref = torch.from_numpy(raw[..., 2:].copy().view(np.int8).reshape(6, 256))
    assert np.array_equal(d.numpy().astype(np.float16), d_ref)
    ties = x[-1, 33:64]
    assert torch.equal(q[-1, 33:64], torch.round(ties).to(torch.int8))  # half to even: 0.5 -> 0, 1.5 -> 2
    assert torch.equal(q_ref[-1, 33:64], (torch.sign(ties) * torch.floor(ties.abs() + 0.5)).to(torch.int8))
    q_ref[-1, 33:64] = q[-1, 33:64]
    assert torch.equal(q, q_ref)  # everywhere else, ggml's own rounding
    xr = dequantize_act(q, d)
    assert bool(((xr - x).abs() <= d.repeat_interleave(32, dim=1) / 2 + 1e-7).all())
    assert torch.equal(q[0, :32], torch.zeros(32, dtype=torch.int8)) and float(d[0, 0]) == 0.0
    assert torch.equal(q[-1, 32:64].abs().max(), torch.tensor(127, dtype=torch.int8))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_act(torch.randn(2, 48))


def reference(x: torch.Tensor, blocks, in_scale=None, out_scale=None, bias=None) -> torch.Tensor:
    """float64 (round_act(x * in_scale) @ W^T) * out_scale + bias, W dequantized by gguf-py."""
    n, k = blocks.shape
    w = torch.from_numpy(dequantize(blocks.data.numpy(), GGMLQuantizationType[blocks.ggml_type]).reshape(n, k))
    xs = x if in_scale is None else x * in_scale
    y = round_act(xs).double() @ w.double().T
    y = y if out_scale is None else y * out_scale.double()
    return (y if bias is None else y + bias.double()).float()


def tol(x: torch.Tensor, blocks) -> float:
    """fp32 rounding of the block sums: ~K eps-scaled by sum |x w| (K-independent loose bound)."""
    n, k = blocks.shape
    w = torch.from_numpy(dequantize(blocks.data.numpy(), GGMLQuantizationType[blocks.ggml_type]).reshape(n, k))
    return 2e-6 * float((x.abs().double() @ w.abs().double().T).max()) + 1e-7


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("b", [1, 5])
def test_a8_kernels_equal_the_definition(ggml_type: str, b: int) -> None:
    mod = native()
    if mod is None:
        pytest.skip("no C++ compiler / SCRATCHLM_KERNELS=0: the fallback is tested below")
    g = torch.Generator().manual_seed(b)
    n, k = 40, 160  # 40 rows: two 16-row groups and a padded third; 5 rows: one 4-row tile and a 1-row one
    blocks = quantize_blocks(torch.randn(n, k, generator=g) * 0.3, ggml_type)
    x = activations(b, k, seed=b)
    q, d = mod.quantize_act(x)
    q_ref, d_ref = quantize_act(x)
    assert torch.equal(q, q_ref) and torch.equal(d, d_ref)
    in_scale, out_scale, bias = torch.rand(k, generator=g) + 0.5, torch.rand(n, generator=g) + 0.5, torch.randn(n)
    lin = ops.a8_linear(mod, blocks, in_scale, out_scale, bias)
    want = reference(x, blocks, in_scale, out_scale, bias)
    torch.testing.assert_close(lin.forward(x), want, rtol=0, atol=tol(x * in_scale, blocks) * 1.5 + 1e-6)
    plain = ops.a8_linear(mod, blocks).forward(x)
    torch.testing.assert_close(plain, reference(x, blocks), rtol=0, atol=tol(x, blocks))
    # fp32 activations give a different function: the test tells the two apart
    exact = ops.linear_blocks(mod, x, blocks)
    assert float((exact - plain).abs().max()) > 100 * tol(x, blocks)


@pytest.mark.parametrize("native_on", [True, False])
@pytest.mark.parametrize("quant", ["q8_0_a8", "q4_1_a8"])
def test_packed_linear_a8_formats(monkeypatch, quant: str, native_on: bool) -> None:
    """PackedLinear in an A8 format (kernels, or the pure-torch fallback) == the definition."""
    if native_on and native() is None:
        pytest.skip("no native kernels on this machine")
    if not native_on:
        monkeypatch.setattr(packed_linear.ops, "native_kernels", lambda: None)
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(40, 64, generator=g) * 0.2, torch.randn(40, generator=g)
    in_scale, out_scale = torch.rand(64, generator=g) + 0.5, torch.rand(40, generator=g) + 0.5
    blocks = quantize_blocks(w, quant[:4].upper())
    lin = PackedLinear(None, bias, torch.float32, quant, blocks, in_scale, out_scale)
    assert (lin.native is not None) == native_on
    x = activations(3, 64)
    torch.testing.assert_close(lin(x), reference(x, blocks, in_scale, out_scale, bias), rtol=1e-5, atol=1e-5)


def a8_reference_model(m: torch.nn.Module, ggml_type: str) -> torch.nn.Module:
    """m with every matrix (not the embedding lookup) replaced by its dequantized blocks and reading
    round_act of its input: the A8 model written with torch modules."""
    ref = copy.deepcopy(m)
    with torch.no_grad():
        for name, mod in ref.named_modules():
            if hasattr(mod, "weight") and mod.weight is not None and mod.weight.dim() == 2 and "embed" not in name:
                mod.weight.copy_(dequantize_blocks(quantize_blocks(mod.weight, ggml_type)))
                mod.register_forward_pre_hook(lambda _m, args: (round_act(args[0]), *args[1:]))
    return ref


@pytest.mark.parametrize("quant", ["q8_0_a8", "q4_1_a8"])
def test_a8_decoder_is_the_a8_model(one_torch_thread, quant: str) -> None:
    m = model(tie=False)
    ref = a8_reference_model(m, quant[:4].upper())
    dec = FastDecoder(m, quant=quant)
    ids = torch.tensor(PROMPTS[:1])
    c_ref, c_dec = ref.new_kv_cache(1, 32), ref.new_kv_cache(1, 32)
    tokens, worst, gap = set(), 0.0, 0.0
    with torch.no_grad():
        ref(ids, kv_cache=c_ref)
        ref(ids, kv_cache=c_dec)
        tok = ids[:, -1]
        for s in range(ids.shape[1], ids.shape[1] + 8):
            pos = torch.full((1,), s)
            want = ref(tok[:, None], pos[:, None], kv_cache=c_ref)[:, -1]
            got = dec.step(tok, pos, None, c_dec)
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
            tok = want.argmax(-1)
            assert torch.equal(got.argmax(-1), tok)
            tokens.add(int(tok))
    assert worst < 1e-4, worst
    assert len(tokens) > 3, "degenerate output makes this test weak"
