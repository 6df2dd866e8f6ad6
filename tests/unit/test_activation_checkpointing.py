"""TransformerLM.activation_checkpointing: recomputing each block in the backward gives the same loss and
bit-identical gradients (the recomputed forward is the same ops on the same inputs), also for MoE router
logits and sliding windows; it is off outside training."""

import copy

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.train.losses import cross_entropy
from scratchlm.train.moe_loss import load_balancing_loss


@pytest.mark.parametrize("overrides", [{}, {"attn_impl": "sdpa", "ops_impl": "fused", "sliding_window": 5},
                                       {"moe_num_experts": 4, "moe_top_k": 2}])
def test_gradients_are_bit_identical(overrides):
    torch.manual_seed(0)
    a = TransformerLM(get_preset("llama-tiny", vocab_size=64, n_layers=3, **overrides)).train()
    b = copy.deepcopy(a)
    b.activation_checkpointing = True
    ids = torch.randint(0, 64, (2, 12))
    losses = []
    for m in (a, b):
        logits, router = m(ids, return_router_logits=True)
        loss = cross_entropy(logits[:, :-1], ids[:, 1:])
        if router:
            loss = loss + 0.01 * load_balancing_loss(router, 2)
        loss.backward()
        losses.append(loss)
    assert torch.equal(losses[0], losses[1])
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_checkpointing_saves_block_activations():
    """Fewer tensors are kept for the backward: count the saved-tensor bytes with autograd's hooks."""
    torch.manual_seed(0)
    model = TransformerLM(get_preset("llama-tiny", vocab_size=64, n_layers=4)).train()
    ids = torch.randint(0, 64, (2, 32))
    saved = {}
    for flag in (False, True):
        model.activation_checkpointing = flag
        total = [0]

        def pack(t, total=total):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids).sum().backward()
        saved[flag] = total[0]
    assert saved[True] < 0.5 * saved[False]
    model.eval()
    model.activation_checkpointing = True
    with torch.no_grad():
        assert model(ids).shape == (2, 32, 64)
