"""GGUF import against transformers' own GGUF loader and the HF models the files were written from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from gguf_helpers import write_gguf
from interop_helpers import build_hf, hf_logits, random_ids, randomize_
from scratchlm.interop.gguf.model_load import load_gguf
from scratchlm.quant.dequantize import dequantize

TOL = 1e-4


def hf_from_gguf(path):
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@torch.no_grad()
def our_logits(model, ids):
    return model(ids).float()


@pytest.mark.parametrize("family", ["llama_tied_gqa", "llama_untied_gqa", "qwen2", "qwen3"])
def test_f32_gguf_equals_source_model_and_transformers(tmp_path, family):
    hf = build_hf(family)
    arch = family.split("_")[0]
    path = write_gguf(hf, tmp_path / "m.gguf", arch)
    ids = random_ids()
    want = hf_logits(hf, ids)
    ours = load_gguf(path, dtype=torch.float32, keep_quantized=False)
    assert ours.config.tie_embeddings == hf.config.tie_word_embeddings
    assert (ours(ids) - want).abs().max() <= TOL
    if family != "qwen3":  # transformers' GGUF reader ignores qwen3.attention.key_length (assumes head_dim 128)
        assert (hf_logits(hf_from_gguf(path), ids) - want).abs().max() <= TOL  # the file is what transformers reads
    # the q/k rows came back in HF order: the weights are exactly the source model's
    src = hf.state_dict()
    for name, p in ours.state_dict().items():
        if name in src:
            assert torch.equal(p, src[name]), name


def test_llama_loaded_interleaved_keeps_llama_cpp_rows(tmp_path):
    """rope_style="interleaved" keeps llama.cpp's q/k row order and computes the same logits."""
    hf = build_hf("llama_tied_gqa")
    path = write_gguf(hf, tmp_path / "m.gguf", "llama")
    ids = random_ids()
    half = load_gguf(path, dtype=torch.float32, keep_quantized=False)
    inter = load_gguf(path, dtype=torch.float32, rope_style="interleaved")
    assert inter.config.rope_style == "interleaved"
    assert (our_logits(inter, ids) - our_logits(half, ids)).abs().max() <= TOL
    from gguf import GGUFReader
    raw = {t.name: t for t in GGUFReader(path).tensors}
    q = torch.from_numpy(raw["blk.0.attn_q.weight"].data.copy())
    assert torch.equal(inter.state_dict()["model.layers.0.self_attn.q_proj.weight"], q)  # file order as is
    assert not torch.equal(half.state_dict()["model.layers.0.self_attn.q_proj.weight"], q)


def _quant_model() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=96, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return randomize_(LlamaForCausalLM(config)).eval()


QUANT_TYPES = {  # every supported type on some matrix of a 2-layer llama
    "model.embed_tokens.weight": "Q8_0", "lm_head.weight": "Q6_K",
    "model.layers.0.self_attn.q_proj.weight": "Q4_0", "model.layers.0.self_attn.k_proj.weight": "Q4_1",
    "model.layers.0.self_attn.v_proj.weight": "Q4_K", "model.layers.0.self_attn.o_proj.weight": "Q5_K",
    "model.layers.0.mlp.gate_proj.weight": "F16", "model.layers.0.mlp.up_proj.weight": "BF16",
    "model.layers.0.mlp.down_proj.weight": "Q6_K", "model.layers.1.self_attn.q_proj.weight": "Q4_K",
    "model.layers.1.self_attn.k_proj.weight": "Q5_K", "model.layers.1.mlp.down_proj.weight": "Q4_1",
}


def test_quantized_gguf_equals_transformers_and_keeps_blocks(tmp_path):
    path = write_gguf(_quant_model(), tmp_path / "q.gguf", "llama", types=QUANT_TYPES, default_type="Q8_0")
    ids = random_ids(2, 16)
    ours = load_gguf(path, dtype=torch.float32)
    theirs = hf_from_gguf(path)
    their_state = theirs.state_dict()
    for name, p in ours.state_dict().items():  # transformers dequantizes the same values (its own code)
        assert torch.equal(p, their_state[name]), name
    want = hf_logits(theirs, ids)
    assert (our_logits(ours, ids) - want).abs().max() <= TOL * want.abs().max()  # logits ~1e2 here
    blocks = ours.quantized_weights
    weights = ours.state_dict()
    assert set(blocks) == {k for k, v in weights.items() if v.dim() == 2}
    for name, b in blocks.items():
        assert b.ggml_type == QUANT_TYPES.get(name, "Q8_0"), name
        # the kept blocks dequantize to exactly the model's weights (q/k rows in the model's order)
        assert torch.equal(dequantize(b.data, b.ggml_type, b.shape), weights[name]), name


def test_quantized_blocks_follow_interleaved_rows(tmp_path):
    path = write_gguf(_quant_model(), tmp_path / "q.gguf", "llama", types=QUANT_TYPES, default_type="Q8_0")
    model = load_gguf(path, rope_style="interleaved", dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    b = model.quantized_weights["model.layers.1.self_attn.k_proj.weight"]
    assert torch.equal(dequantize(b.data, b.ggml_type, b.shape).to(torch.bfloat16),
                       model.model.layers[1].self_attn.k_proj.weight)


def test_unsupported_files_are_refused_by_name(tmp_path):
    hf = build_hf("llama_tied_gqa")
    cases = [
        (dict(metadata={"llama.rope.scaling.type": "su"}), "llama.rope.scaling.type='su' is not supported"),
        (dict(metadata={"llama.expert_count": 8}), "llama.expert_count=8 is not supported"),
        (dict(types={"model.layers.0.mlp.up_proj.weight": "MXFP4"}), "blk.0.ffn_up.weight.*MXFP4"),
    ]
    for n, (kwargs, message) in enumerate(cases):
        path = write_gguf(hf, tmp_path / f"bad{n}.gguf", "llama", **kwargs)
        with pytest.raises(ValueError, match=message):
            load_gguf(path)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_gguf(not_gguf)


def test_unknown_architecture_and_tensor_are_refused(tmp_path):
    import gguf

    from scratchlm.interop.gguf.tensor_names import hf_name

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match="general.architecture='mamba' is not supported.*llama, qwen2, qwen3"):
        load_gguf(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="blk.0.ssm_conv1d.weight"):
        hf_name("blk.0.ssm_conv1d.weight")


def mapped_file(address: int) -> str | None:
    """The file whose memory mapping holds `address` in this process (/proc/self/maps), or None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split()
        lo, hi = (int(a, 16) for a in span.split("-"))
        if lo <= address < hi:
            return rest[4] if len(rest) > 4 else None
    return None


@pytest.mark.parametrize("family", ["llama_tied_gqa", "llama_untied_gqa", "qwen2", "qwen3"])
def test_gguf_on_its_own_blocks_equals_the_dequantized_model(tmp_path, family):
    """dtype=None: every matrix stays the file's bytes (in the file's mapping, not a copy); the model computes
    the logits of the dequantized weights: transformers' GGUF reader (where it reads the file), the source
    model (an F32 file), and our own dense load (q/k rows of llama left interleaved, the dense ones not)."""
    arch = family.split("_")[0]
    types = QUANT_TYPES if family == "llama_untied_gqa" else {}
    default = "F32" if family == "llama_tied_gqa" else "Q8_0"
    hf_model = _quant_model() if family == "llama_untied_gqa" else build_hf(family)
    path = write_gguf(hf_model, tmp_path / "b.gguf", arch, types=types, default_type=default)
    ours = load_gguf(path, dtype=None)
    assert all(p.dim() == 1 for p in ours.parameters())  # only norms / biases are float parameters
    q = ours.model.layers[0].self_attn.q_proj
    assert mapped_file(q.data.data_ptr()) == str(path)  # the bytes live in the file's mapping: no copy
    assert q.ggml_type == types.get("model.layers.0.self_attn.q_proj.weight", default)
    if ours.config.tie_embeddings:
        assert ours.lm_head.data.data_ptr() == ours.model.embed_tokens.data.data_ptr()
    assert ours.config.rope_style == ("interleaved" if arch == "llama" else "half")
    ids = random_ids(2, 16)
    got = our_logits(ours, ids)
    dense = load_gguf(path, dtype=torch.float32, keep_quantized=False)
    want = our_logits(dense, ids)
    assert (got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max())
    if default == "F32":
        assert (got - hf_logits(hf_model, ids)).abs().max() <= TOL
    elif family != "qwen3":  # transformers' GGUF reader assumes head_dim 128 for qwen3
        theirs = hf_logits(hf_from_gguf(path), ids)
        assert (got - theirs).abs().max() <= TOL * max(1.0, theirs.abs().max())


def test_dense_state_of_a_block_model_is_the_dense_load(tmp_path):
    """nn/block_state.dense_state_dict: every matrix of a model on blocks, dequantized under its dense name,
    equals the dense load's state (same interleaved q/k rows) — what checkpoints and exports write."""
    from scratchlm.nn.block_state import dense_state_dict, has_blocks

    path = write_gguf(_quant_model(), tmp_path / "q.gguf", "llama", types=QUANT_TYPES, default_type="Q8_0")
    blocks = load_gguf(path)
    dense = load_gguf(path, dtype=torch.float32, keep_quantized=False, rope_style="interleaved")
    assert has_blocks(blocks) and not has_blocks(dense)
    got, want = dense_state_dict(blocks), dense.state_dict()
    assert set(got) == set(want)
    for name, value in want.items():
        assert torch.equal(got[name], value), name
