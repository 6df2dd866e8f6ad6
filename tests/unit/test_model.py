"""TransformerLM: logits vs HF LlamaForCausalLM (same weights, same names), post-norm and positions,
causality (hypothesis), KV-cache decode == full forward, init, and bad-input errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from scratchlm.config import ModelConfig, get_preset
from scratchlm.model import TransformerLM
from scratchlm.model_stats import model_stats


def _hf_llama(c: ModelConfig) -> LlamaForCausalLM:
    hf_cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps, rope_theta=c.rope_base, tie_word_embeddings=c.tie_embeddings,
        attention_bias=False, mlp_bias=False,
    )
    return LlamaForCausalLM(hf_cfg).eval()


@pytest.mark.parametrize("tie, impl, ops", [(True, "reference", "reference"), (False, "sdpa", "reference"),
                                           (False, "reference", "reference"), (True, "sdpa", "fused")])
def test_llama_style_logits_match_hf(tie: bool, impl: str, ops: str) -> None:
    config = get_preset("llama-tiny", tie_embeddings=tie, attn_impl=impl, ops_impl=ops, vocab_size=300, max_seq_len=64)
    ours = TransformerLM(config).eval()
    hf = _hf_llama(config)
    missing, unexpected = hf.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # identical parameter names
    ids = torch.randint(0, 300, (3, 20))
    with torch.no_grad():
        diff = (ours(ids) - hf(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_param_count_matches_hf() -> None:
    for tie in (True, False):
        config = get_preset("llama-tiny", tie_embeddings=tie)
        ours = TransformerLM(config)
        assert model_stats(ours, config).n_params == _hf_llama(config).num_parameters()


def test_flops_per_token_formula() -> None:
    c = get_preset("llama-small")
    stats = model_stats(TransformerLM(c), c, seq_len=256)
    d, f, hd = c.d_model, c.d_ff, c.head_dim
    per_layer = d * c.n_heads * hd * 2 + d * c.n_kv_heads * hd * 2 + 3 * d * f  # q,o + k,v + gate,up,down
    n_matmul = c.n_layers * per_layer + c.vocab_size * d
    assert stats.flops_per_token_fwd == 2 * n_matmul + 4 * c.n_layers * c.n_heads * hd * 256
    assert stats.flops_per_token_train == 3 * stats.flops_per_token_fwd


def test_post_norm_block_matches_manual() -> None:
    config = get_preset("gpt2-tiny", norm_placement="post", n_layers=1, vocab_size=50, max_seq_len=32)
    model = TransformerLM(config).eval()
    ids = torch.randint(0, 50, (2, 9))
    layer = model.model.layers[0]
    x = model.model.embed_tokens.weight[ids] + model.model.embed_positions.weight[:9]
    ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
    h = F.layer_norm(x + layer.self_attn(x), (128,), ln1.weight, ln1.bias, 1e-5)
    mlp = F.linear(F.gelu(F.linear(h, layer.mlp.up_proj.weight, layer.mlp.up_proj.bias), approximate="tanh"),
                   layer.mlp.down_proj.weight, layer.mlp.down_proj.bias)
    out = F.layer_norm(h + mlp, (128,), ln2.weight, ln2.bias, 1e-5)
    assert model.model.norm is None  # post-norm blocks end in a norm already
    torch.testing.assert_close(model(ids), out @ model.model.embed_tokens.weight.T, rtol=1e-5, atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["llama-tiny", "gpt2-tiny"]), st.integers(0, 14), st.integers(0, 2**16))
def test_causality(preset: str, t: int, seed: int) -> None:
    """Changing tokens after position t never changes logits at positions <= t."""
    torch.manual_seed(seed % 7)
    model = TransformerLM(get_preset(preset, n_layers=2, attn_impl="reference")).eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1024, (1, 16), generator=g)
    changed = ids.clone()
    changed[0, t + 1:] = torch.randint(0, 1024, (16 - t - 1,), generator=g)
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-5)
    if t < 14:
        assert (a[:, t + 1:] - b[:, t + 1:]).abs().max() > 0


@pytest.mark.parametrize("preset, impl", [("llama-tiny", "reference"), ("llama-tiny", "sdpa"), ("gpt2-tiny", "reference")])
def test_kv_cache_decode_equals_full_forward(preset: str, impl: str) -> None:
    model = TransformerLM(get_preset(preset, attn_impl=impl)).eval()
    ids = torch.randint(0, 1024, (2, 12))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_kv_cache(batch_size=2, max_seq_len=32)
        steps = [model(ids[:, :5], kv_cache=cache)]  # prefill 5, then decode one at a time
        steps += [model(ids[:, i:i + 1], kv_cache=cache) for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.seq_len == 12


def test_init_weights_scales_residual_projections() -> None:
    c = get_preset("llama-small", n_layers=8)
    model = TransformerLM(c)
    o = torch.cat([l.self_attn.o_proj.weight.flatten() for l in model.model.layers])
    q = torch.cat([l.self_attn.q_proj.weight.flatten() for l in model.model.layers])
    assert o.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.02)
    assert q.std().item() == pytest.approx(0.02, rel=0.02)
    assert torch.equal(model.model.norm.weight, torch.ones(c.d_model))
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize(
    "ids, match",
    [
        (torch.tensor([[1, 1024]]), "id 1024 >= vocab_size 1024"),
        (torch.tensor([[-3, 1]]), "negative id -3"),
        (torch.tensor([1, 2, 3]), r"\(B, T\) integer tensor"),
        (torch.tensor([[1.0, 2.0]]), "integer dtype"),
        (torch.zeros(1, 257, dtype=torch.long), "sequence length 257 exceeds the model context max_seq_len=256"),
        (torch.zeros(1, 0, dtype=torch.long), "empty"),
    ],
)
def test_model_bad_input(ids: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TransformerLM(get_preset("llama-tiny"))(ids)
