"""FFNs vs torch.nn.functional compositions; the SwiGLU width rule."""

import pytest
import torch
import torch.nn.functional as F

from scratchlm.nn import MLP, SwiGLU, swiglu_hidden_dim


def test_swiglu_matches_torch() -> None:
    ffn = SwiGLU(16, 48)
    x = torch.randn(2, 5, 16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    ref = F.linear(F.silu(F.linear(x_ref, ffn.gate_proj.weight)) * F.linear(x_ref, ffn.up_proj.weight), ffn.down_proj.weight)
    out = ffn(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation, approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_mlp_matches_torch(activation: str, approximate: str) -> None:
    mlp = MLP(16, 64, activation=activation, bias=True)
    x = torch.randn(3, 16)
    ref = F.linear(F.gelu(F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias), approximate=approximate),
                   mlp.down_proj.weight, mlp.down_proj.bias)
    torch.testing.assert_close(mlp(x), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d, multiple, expected", [(384, 64, 1024), (4096, 256, 11008), (128, 64, 384), (96, 1, 256)])
def test_swiglu_hidden_dim(d: int, multiple: int, expected: int) -> None:
    # 4096 -> 11008 is Llama-1 7B's published d_ff (8/3*4096 = 10922.7 rounded up to a multiple of 256).
    assert swiglu_hidden_dim(d, multiple) == expected
