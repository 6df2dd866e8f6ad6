"""LoRA from scratch: the layer's formula, zero start, frozen base, dropout, merge/unmerge; and PEFT's own
PeftModel loading our saved adapter onto the transformers model with the logits of our merged model."""

from __future__ import annotations

import copy

import pytest
import torch

from scratchlm.config import get_preset
from scratchlm.interop.hf.peft_adapter import load_adapter, save_adapter
from scratchlm.interop.hf.model_dir import save_pretrained
from scratchlm.model import TransformerLM
from scratchlm.nn.linear import Linear
from scratchlm.nn.lora import LoRALinear, adapters_disabled, apply_lora, lora_state_dict, merge_lora


def _layer(dropout: float = 0.0) -> LoRALinear:
    torch.manual_seed(0)
    base = Linear(6, 5, bias=True)
    layer = LoRALinear(base, r=2, alpha=6.0, dropout=dropout)
    torch.nn.init.normal_(layer.lora_B.weight)  # a trained-looking B
    return layer


def test_lora_linear_formula_merge_and_frozen_base():
    layer = _layer()
    x = torch.randn(3, 4, 6)
    w, b = layer.base_layer.weight.detach().clone(), layer.base_layer.bias.detach()
    a, bb = layer.lora_A.weight.detach(), layer.lora_B.weight.detach()
    expect = torch.nn.functional.linear(x, w, b) + 3.0 * (x @ a.T @ bb.T)  # alpha / r = 3
    torch.testing.assert_close(layer(x), expect, rtol=1e-5, atol=1e-6)
    layer(x).sum().backward()
    assert layer.base_layer.weight.grad is None and layer.lora_A.weight.grad is not None
    layer.merge()
    torch.testing.assert_close(layer.base_layer.weight, w + 3.0 * bb @ a, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(layer(x), expect, rtol=1e-5, atol=1e-5)  # merged forward: same function
    layer.unmerge()
    torch.testing.assert_close(layer.base_layer.weight, w, rtol=0, atol=1e-6)
    fresh = LoRALinear(Linear(6, 5), r=2, alpha=1.0)
    assert torch.equal(fresh(x), fresh.base_layer(x))  # B = 0: starts as the base layer
    bound = 1 / 6 ** 0.5  # A ~ U(-1/sqrt(in), 1/sqrt(in)), PEFT's kaiming_uniform(a=sqrt(5))
    assert float(fresh.lora_A.weight.detach().abs().max()) <= bound


def test_dropout_only_in_training_and_on_the_adapter_path():
    layer = _layer(dropout=0.5)
    x = torch.randn(200, 6)
    layer.eval()
    no_drop = layer(x)
    layer.train()
    torch.manual_seed(5)
    got = layer(x)
    torch.manual_seed(5)
    keep = (torch.rand_like(x) >= 0.5).float()
    expect = layer.base_layer(x) + 3.0 * layer.lora_B(layer.lora_A(x * keep / 0.5))
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, no_drop)


def test_apply_lora_freezes_the_rest_and_errors():
    model = TransformerLM(get_preset("llama-tiny", vocab_size=40, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2))
    names = apply_lora(model, ["q_proj", "v_proj"], r=4, alpha=8)
    assert names == [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("q_proj", "v_proj")]
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(lora_state_dict(model)) and len(trainable) == 8
    ids = torch.randint(0, 40, (1, 6))
    with adapters_disabled(model):
        base_out = model(ids)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            torch.nn.init.normal_(m.lora_B.weight)
    with adapters_disabled(model):
        torch.testing.assert_close(model(ids), base_out)  # the reference = the base model
    assert not torch.allclose(model(ids), base_out)
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(model, ["q_proj"], 2, 2)
    fresh = TransformerLM(model.config)
    with pytest.raises(ValueError, match="choose from"):
        apply_lora(fresh, ["qkv"], 2, 2)
    with pytest.raises(ValueError, match="rank r"):
        apply_lora(fresh, ["q_proj"], 0, 2)
    with pytest.raises(ValueError, match="exceeds"):
        apply_lora(TransformerLM(model.config), ["q_proj"], 64, 2)


@pytest.mark.parametrize("rope_style", ["half", "interleaved"])
def test_peft_loads_our_adapter_onto_the_transformers_model(tmp_path, rope_style, one_torch_thread):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = get_preset("llama-tiny", vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                     rope_style=rope_style, tie_embeddings=False)
    ours = TransformerLM(cfg).eval()
    save_pretrained(ours, tmp_path / "hf")
    apply_lora(ours, ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"], r=4, alpha=8, dropout=0.1)
    for m in ours.modules():
        if isinstance(m, LoRALinear):
            torch.nn.init.normal_(m.lora_B.weight, std=0.2)
    save_adapter(ours, tmp_path / "adapter", base_model=str(tmp_path / "hf"))
    ids = torch.randint(0, 64, (2, 9))
    merged = merge_lora(copy.deepcopy(ours)).eval()
    with torch.no_grad():
        want = merged(ids)
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "hf"),
                                               tmp_path / "adapter").eval()
        got = peft_model(ids).logits
        assert (want - ours.eval()(ids)).abs().max() < 1e-5  # merged == unmerged
        reloaded = load_adapter(TransformerLM(cfg), tmp_path / "adapter")
        reloaded.load_state_dict({k: v for k, v in ours.state_dict().items() if "lora_" not in k}, strict=False)
        again = reloaded.eval()(ids)
        with adapters_disabled(ours):
            base = ours(ids)
    assert (got - want).abs().max() < 1e-5
    assert (again - want).abs().max() < 1e-5
    assert (want - base).abs().max() > 1e-2  # the adapter really changes the model
