"""QLoRA: LoRA adapters on a GGUF model kept in its ggml blocks (nn/block_linear.py) train exactly like the
same adapters on the dequantized fp32 model: same loss, same adapter gradients (fp32 summation-order
tolerance), and merging gives the dense model with the update folded in."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from scratchlm.interop.gguf.model_load import load_gguf
from scratchlm.nn.block_linear import BlockLinear
from scratchlm.nn.linear import Linear
from scratchlm.nn.lora import apply_lora, lora_layers, merge_lora
from scratchlm.train.losses import cross_entropy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
from gguf_helpers import tiny_hf_model, write_gguf  # noqa: E402

TYPES = {"model.layers.0.self_attn.q_proj.weight": "Q4_0", "model.layers.0.self_attn.v_proj.weight": "Q5_1",
         "model.layers.1.mlp.down_proj.weight": "Q5_0"}


def _pair(tmp_path):
    hf = tiny_hf_model("llama", 300)
    path = write_gguf(hf, tmp_path / "m.gguf", "llama", types=TYPES, default_type="Q8_0")
    blocks = load_gguf(path, dtype=None)  # q/k rows interleaved: the dense twin keeps the same order
    dense = load_gguf(path, dtype=torch.float32, keep_quantized=False, rope_style="interleaved")
    for m in (blocks, dense):
        torch.manual_seed(0)
        apply_lora(m, ["q_proj", "v_proj", "down_proj"], r=4, alpha=8.0)
        for layer in lora_layers(m).values():
            torch.nn.init.normal_(layer.lora_B.weight, std=0.1)  # a non-zero update, the same on both
    return blocks, dense


def test_qlora_loss_and_adapter_gradients_equal_lora_on_the_dequantized_model(tmp_path):
    blocks, dense = _pair(tmp_path)
    assert isinstance(blocks.model.layers[0].self_attn.q_proj.base_layer, BlockLinear)
    assert isinstance(dense.model.layers[0].self_attn.q_proj.base_layer, Linear)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    losses = []
    for m in (blocks, dense):
        m.train()
        loss = cross_entropy(m(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        losses.append(loss.detach())
    assert torch.allclose(losses[0], losses[1], rtol=1e-5)
    trained = [(n, p) for n, p in blocks.named_parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n, _ in trained)
    ref = dict(dense.named_parameters())
    for name, p in trained:
        g, want = p.grad, ref[name].grad
        assert torch.allclose(g, want, rtol=1e-4, atol=1e-5 * float(want.abs().max())), name


def test_merging_a_quantized_base_gives_the_dense_model_with_the_update(tmp_path):
    blocks, dense = _pair(tmp_path)
    ids = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = dense.eval()(ids)
        merged = merge_lora(blocks.eval())
        assert isinstance(merged.model.layers[0].self_attn.q_proj, Linear)  # dense, update folded in
        assert isinstance(merged.model.layers[0].self_attn.k_proj, BlockLinear)  # untouched layers keep blocks
        got = merged(ids)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_a_merged_qlora_model_saves_every_matrix(tmp_path):
    """After merging, the layers that kept their blocks are written dequantized (a block layer's bytes are a
    non-persistent buffer): the saved checkpoint reloads to the same logits, and save_pretrained writes what
    transformers reloads with them."""
    from transformers import AutoModelForCausalLM

    from scratchlm.interop.hf.model_dir import save_pretrained
    from scratchlm.model_files import load_model, save_model

    blocks, _ = _pair(tmp_path)
    merged = merge_lora(blocks.eval())
    ids = torch.randint(0, 300, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = merged(ids)
        back = load_model(save_model(merged, tmp_path / "ckpt")).eval()
        assert torch.allclose(back(ids), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        save_pretrained(merged, tmp_path / "hf")
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
        assert torch.allclose(hf(ids).logits, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
