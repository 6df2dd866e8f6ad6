"""The fused fast path (ModelConfig.ops_impl="fused": F.rms_norm, F.layer_norm, F.silu/F.gelu, RoPE as
x*cos + rot(x)*sin) equals our from-scratch reference path: values and gradients, module by module
and for whole models (forward, loss gradients), fp32 and bf16."""

from __future__ import annotations

import pytest
import torch

from scratchlm.config import ModelConfig, get_preset
from scratchlm.model import TransformerLM
from scratchlm.nn.activations import ACTIVATIONS, get_activation
from scratchlm.nn.norm import LayerNorm, RMSNorm
from scratchlm.nn.rope import RotaryEmbedding, rope_rotation, rotate_pairs


def values_and_grads(fn, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """fn(*inputs) and d(sum(out * w))/d inputs for a fixed random w (exercises the backward)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.dtype)
    grads = torch.autograd.grad((out * w).sum(), leaves)
    return [out, *grads]


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_torch_activations_equal_ours(name: str) -> None:
    x = torch.cat([torch.linspace(-30, 30, 601), torch.randn(400) * 3])
    ours = values_and_grads(get_activation(name), x)
    fused = values_and_grads(get_activation(name, fused=True), x)
    for a, b in zip(ours, fused):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=5e-6)  # ours: 1 + tanh cancels near -5 (1e-6 abs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["rms", "layer", "layer-nobias"])
def test_fused_norms_equal_reference(kind: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    make = {"rms": lambda f: RMSNorm(48, 1e-6, fused=f), "layer": lambda f: LayerNorm(48, 1e-5, fused=f),
            "layer-nobias": lambda f: LayerNorm(48, 1e-5, bias=False, fused=f)}[kind]
    ref, fused = make(False), make(True)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape))
    fused.load_state_dict(ref.state_dict())
    x = (torch.randn(4, 7, 48) * 5 + 1).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for a, b in zip(values_and_grads(ref, x), values_and_grads(fused, x)):
        torch.testing.assert_close(b, a, **tol)
    # parameter gradients too
    for m in (ref, fused):
        m.zero_grad()
        m(x.float()).pow(2).sum().backward()
    for p_ref, p_fused in zip(ref.parameters(), fused.parameters()):
        torch.testing.assert_close(p_fused.grad, p_ref.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("per_row", [False, True])
def test_fused_rope_equals_reference(style: str, per_row: bool) -> None:
    ref, fused = RotaryEmbedding(16, 64, 10000.0, style), RotaryEmbedding(16, 64, 10000.0, style, fused=True)
    x = torch.randn(2, 3, 5, 16)
    pos = torch.tensor([[0, 7, 8, 30, 63], [2, 3, 4, 5, 6]]) if per_row else torch.tensor([1, 2, 9, 10, 40])
    for a, b in zip(values_and_grads(lambda t: ref(t, pos), x), values_and_grads(lambda t: fused(t, pos), x)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rotate_pairs_is_a_quarter_turn_of_each_pair(style: str) -> None:
    x = torch.randn(3, 8)
    rot = rotate_pairs(x, style)
    idx = [(i, i + 4) for i in range(4)] if style == "half" else [(2 * i, 2 * i + 1) for i in range(4)]
    for a, b in idx:  # (a, b) -> (-b, a)
        assert torch.equal(rot[:, a], -x[:, b]) and torch.equal(rot[:, b], x[:, a])
    assert torch.equal(x @ rope_rotation(8, style), rot)
    assert torch.equal(rotate_pairs(rotate_pairs(x, style), style), -x)


MODELS = {
    "llama": get_preset("llama-tiny", vocab_size=200, max_seq_len=32, n_kv_heads=2, attn_impl="sdpa"),
    "llama-interleaved-qknorm": get_preset("llama-tiny", vocab_size=200, max_seq_len=32, rope_style="interleaved",
                                           qk_norm=True, qkv_bias=True),
    "gpt2": get_preset("gpt2-tiny", vocab_size=200, max_seq_len=32),
    "post-norm-relu": ModelConfig(vocab_size=200, d_model=64, n_layers=2, n_heads=4, max_seq_len=32,
                                  norm_placement="post", ffn="mlp", activation="relu", norm="layernorm"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_model_equals_reference_model(name: str) -> None:
    torch.manual_seed(0)
    ref = TransformerLM(MODELS[name])
    fused = TransformerLM(MODELS[name].replace(ops_impl="fused"))
    fused.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 200, (2, 24))
    losses = []
    for m in (ref, fused):
        logits = m(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        losses.append((logits, loss))
    torch.testing.assert_close(losses[1][0], losses[0][0], rtol=1e-5, atol=1e-5)
    for (n, p_ref), p_fused in zip(ref.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p_fused.grad, p_ref.grad, rtol=1e-4, atol=1e-6, msg=n)
