"""SmolLM2-135M-Instruct from its Q4_1 GGUF: scratchlm's exact path (fp32 dequantized weights) against transformers
loading the same file."""

from __future__ import annotations

import pytest
import torch

from scratchlm.generate import generate
from scratchlm.quant.dequantize import dequantize

pytestmark = pytest.mark.slow
N_NEW = 128
N_REFERENCE = 24  # the reference forward ("model" decode, ~4x slower per token) is compared on a greedy prefix


def test_weights_are_transformers_weights_and_blocks_match(smollm2_model, hf_smollm2):
    hf, _ = hf_smollm2
    theirs = hf.state_dict()
    ours = smollm2_model.state_dict()
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.29.self_attn.k_proj.weight", "model.layers.17.mlp.down_proj.weight", "model.norm.weight"):
        assert torch.equal(ours[name], theirs[name]), name
    blocks = smollm2_model.quantized_weights
    q = blocks["model.layers.3.self_attn.q_proj.weight"]
    assert q.ggml_type == "Q4_1" and blocks["lm_head.weight"].ggml_type == "Q8_0"
    assert torch.equal(dequantize(q.data, q.ggml_type, q.shape), ours["model.layers.3.self_attn.q_proj.weight"])


def test_greedy_128_tokens_equal_transformers(smollm2_model, smollm2, hf_smollm2):
    hf, hf_tok = hf_smollm2
    messages = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]
    prompt = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                           attention_mask=torch.ones(1, len(prompt), dtype=torch.long), pad_token_id=2)
    want = want[0, len(prompt):].tolist()
    assert len(want) == N_NEW
    # greedy: the first n tokens of a longer run are the n-token run, so a prefix of `want` is the reference
    assert generate(smollm2_model, [prompt], N_NEW, decode="fast")[0] == want
    assert generate(smollm2_model, [prompt], N_REFERENCE, decode="model")[0] == want[:N_REFERENCE]
    # the default load: the model on the file's own blocks, decoded by the default ("auto" = fast-gguf) step
    blocks = smollm2.model
    assert blocks.model.layers[0].self_attn.q_proj.ggml_type == "Q4_1" and not hasattr(blocks, "quantized_weights")
    assert generate(blocks, [prompt], N_NEW, decode="auto")[0] == want
    assert generate(blocks, [prompt], N_REFERENCE, decode="model")[0] == want[:N_REFERENCE]
