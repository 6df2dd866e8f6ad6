"""AdamW from scratch vs torch.optim.AdamW over many steps; parameter groups; the fused fast path."""

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.train.optim import AdamW, build_optimizer, param_groups


def _run(opt_factory, steps: int = 300, seed: int = 0):
    torch.manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(8, 5))
    b = torch.nn.Parameter(torch.randn(5))
    opt = opt_factory([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}])
    g = torch.Generator().manual_seed(seed + 1)
    for i in range(steps):
        x = torch.randn(4, 8, generator=g)
        loss = ((x @ w + b).tanh() - 0.3).square().mean()
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = 1e-2 * (0.5 + 0.5 * (i % 7) / 7)  # a schedule changing lr every step
        opt.step()
    return w.detach(), b.detach(), opt


@pytest.mark.parametrize("betas,eps", [((0.9, 0.999), 1e-8), ((0.8, 0.95), 1e-6)])
def test_adamw_matches_torch_over_many_steps(betas, eps):
    ours = _run(lambda g: AdamW(g, lr=1e-2, betas=betas, eps=eps))
    ref = _run(lambda g: torch.optim.AdamW(g, lr=1e-2, betas=betas, eps=eps, foreach=False))
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-5, atol=1e-6)
    p = ours[2].param_groups[0]["params"][0]
    p_ref = ref[2].param_groups[0]["params"][0]
    torch.testing.assert_close(ours[2].state[p]["exp_avg_sq"], ref[2].state[p_ref]["exp_avg_sq"], rtol=1e-5, atol=1e-9)
    assert float(ours[2].state[p]["step"]) == float(ref[2].state[p_ref]["step"]) == 300


def test_bad_hyperparameters_raise():
    with pytest.raises(ValueError, match="betas"):
        AdamW([torch.nn.Parameter(torch.zeros(1))], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="impl"):
        build_optimizer(TransformerLM(get_preset("llama-tiny")), 1e-3, 0.1, impl="nope")


def test_param_groups_skip_norms_biases_embeddings():
    model = TransformerLM(get_preset("gpt2-tiny", n_layers=1))  # has biases, layernorms, learned positions
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    for name in no_decay["names"]:
        assert "norm" in name or name.endswith("bias") or "embed" in name, name
    for name in decay["names"]:
        assert name.endswith("_proj.weight") or name.endswith(("c_fc.weight", "fc.weight")), name
    all_params = {id(p) for p in model.parameters()}
    assert {id(p) for g in (decay, no_decay) for p in g["params"]} == all_params


def test_fused_fast_path_matches_reference_on_a_model():
    results = []
    for impl in ("reference", "torch"):
        torch.manual_seed(0)
        model = TransformerLM(get_preset("llama-tiny", vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1))
        opt = build_optimizer(model, lr=3e-3, weight_decay=0.1, impl=impl)
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            ids = torch.randint(0, 64, (2, 12), generator=g)
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        results.append(model.state_dict())
    for k in results[0]:
        torch.testing.assert_close(results[0][k], results[1][k], rtol=1e-5, atol=1e-6, msg=k)
