"""Mixture of experts (nn/moe.py) against transformers' own MoE blocks (Mixtral, Qwen3-MoE with and without
norm_topk_prob, Qwen2-MoE with its shared expert), the grouped fast path against the dense reference (values
and gradients), and the load-balancing loss against transformers' load_balancing_loss_func."""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from scratchlm.nn.moe import MoE, route
from scratchlm.train.moe_loss import load_balancing_loss

D, F, E, K = 32, 24, 6, 2
SIZES = dict(hidden_size=D, num_attention_heads=4, num_experts_per_tok=K)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _hf_block(kind: str, norm_topk_prob: bool):
    if kind == "mixtral":
        return MixtralSparseMoeBlock(MixtralConfig(**SIZES, intermediate_size=F, num_local_experts=E)), True, 0
    if kind == "qwen3_moe":
        config = Qwen3MoeConfig(**SIZES, moe_intermediate_size=F, num_experts=E, norm_topk_prob=norm_topk_prob)
        return Qwen3MoeSparseMoeBlock(config), norm_topk_prob, 0
    config = Qwen2MoeConfig(**SIZES, moe_intermediate_size=F, num_experts=E, norm_topk_prob=norm_topk_prob,
                            shared_expert_intermediate_size=40)
    return Qwen2MoeSparseMoeBlock(config), norm_topk_prob, 40


def _ours_from(hf, norm_topk_prob: bool, shared: int, impl: str) -> MoE:
    ours = MoE(D, F, E, K, "softmax_topk", norm_topk_prob, shared, "silu", impl)
    with torch.no_grad():
        ours.gate.weight.copy_(hf.gate.weight)
        gate_up, down = hf.experts.gate_up_proj, hf.experts.down_proj  # (E, 2F, D), (E, D, F)
        ours.experts.gate_proj.copy_(gate_up[:, :F])
        ours.experts.up_proj.copy_(gate_up[:, F:])
        ours.experts.down_proj.copy_(down)
        if shared:
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(ours.shared_expert, name).weight.copy_(getattr(hf.shared_expert, name).weight)
            ours.shared_expert_gate.weight.copy_(hf.shared_expert_gate.weight)
    return ours


@pytest.mark.parametrize("kind,norm", [("mixtral", True), ("qwen3_moe", False), ("qwen3_moe", True),
                                       ("qwen2_moe", False)])
@pytest.mark.parametrize("impl", ["reference", "grouped"])
def test_moe_block_matches_transformers(kind, norm, impl):
    torch.manual_seed(0)
    hf, norm_topk_prob, shared = _hf_block(kind, norm)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    ours = _ours_from(hf, norm_topk_prob, shared, impl)
    x = torch.randn(3, 11, D)
    with torch.no_grad():
        expected = hf(x)
        expected = expected[0] if isinstance(expected, tuple) else expected
        torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("router,norm", [("softmax_topk", False), ("softmax_topk", True), ("topk_softmax", True)])
def test_grouped_equals_dense_reference_values_and_grads(router, norm):
    torch.manual_seed(1)
    ref = MoE(D, F, E, 3, router, norm, shared_d_ff=16, impl="reference")
    fast = MoE(D, F, E, 3, router, norm, shared_d_ff=16, impl="grouped")
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, 9, D, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out_ref, out_fast = ref(x), fast(x2)
    torch.testing.assert_close(out_fast, out_ref, rtol=1e-6, atol=1e-6)
    (out_ref ** 2).sum().backward()
    (out_fast ** 2).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_topk_softmax_is_renormalised_softmax_topk():
    logits = torch.randn(20, E)
    w1, i1 = route(logits, K, "topk_softmax", False)
    w2, i2 = route(logits, K, "softmax_topk", True)
    assert torch.equal(i1, i2)
    torch.testing.assert_close(w1, w2)
    w3, _ = route(logits, K, "softmax_topk", False)
    assert (w3.sum(-1) < 1).all()  # without renormalisation the k weights keep their share of all E


def test_load_balancing_loss_matches_transformers():
    torch.manual_seed(2)
    layers = tuple(torch.randn(40, E, requires_grad=True) for _ in range(3))
    ours = load_balancing_loss(layers, K)
    theirs = load_balancing_loss_func(layers, E, K)
    torch.testing.assert_close(ours, theirs)
    ours.backward()
    assert all(layer.grad is not None and layer.grad.abs().sum() > 0 for layer in layers)
    uniform = load_balancing_loss((torch.zeros(64, E),), K)
    torch.testing.assert_close(uniform, torch.tensor(float(K)))  # a balanced router's value: k


def test_moe_flops_count_the_active_experts():
    """Top-1 of 4 experts of width 16 costs one dense FFN of width 16, plus the router's D x E matmul."""
    from scratchlm.config import ModelConfig
    from scratchlm.model import TransformerLM
    from scratchlm.model_stats import model_stats

    base = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, tie_embeddings=False)
    moe = ModelConfig(**base, moe_num_experts=4, moe_top_k=1, moe_d_ff=16)
    dense = ModelConfig(**base, d_ff=16)
    active = model_stats(TransformerLM(moe), moe).n_matmul
    assert active == model_stats(TransformerLM(dense), dense).n_matmul + 2 * 32 * 4
