"""The less common ways a config maps onto llama.cpp's keys and tensors, each exported and run by llama.cpp itself.

Per variant: a tiny random scratchlm model (some of these configs no transformers family expresses: a llama with
longrope, an OLMo-2 with sliding windows and YaRN, an unfinetuned Granite without RoPE, a Gemma-2 with its own
local RoPE base, models built with interleaved RoPE) -> save_gguf (F32) -> llama.cpp (F32 KV cache) computes
scratchlm's logits (<= 1e-4 relative), and load_gguf reads the file back to the same function (the config it
reads is the one llama.cpp runs, e.g. fixed factor tables come back as rope_freqs).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from gguf_helpers import randomize_family_
from scratchlm.config import ModelConfig
from scratchlm.interop.gguf.model_load import load_gguf
from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.interop.gguf.writer import save_gguf
from scratchlm.interop.hf.config_json import config_from_hf
from scratchlm.model import TransformerLM
from scratchlm.tokenizer.pipeline import Tokenizer as OurTokenizer

import llama_cpp  # in the test extra (pinned)

V = 400  # the conftest tokenizer's vocabulary
PROMPT = [(7 * i + 3) % 390 + 5 for i in range(24)]
BASE = dict(vocab_size=V, d_model=256, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=160, max_seq_len=256, norm_eps=1e-5,
            tie_embeddings=False)


def hf_config(cls: str, **kwargs) -> ModelConfig:
    base = dict(vocab_size=V, hidden_size=256, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return config_from_hf(getattr(transformers, cls)(**{**base, **kwargs}).to_dict())


def longrope(n: int, fixed: bool = False) -> dict:
    short = [1.0 + 0.05 * i for i in range(n)]
    out = {"rope_type": "longrope", "short_factor": short, "long_factor": [1.0 + 0.5 * i for i in range(n)],
           "original_max_position_embeddings": 16}
    return {**out, "long_factor": short, "attention_factor": 1.0} if fixed else out


VARIANTS = {  # name -> (config, expected architecture, tensors the file must hold)
    "llama_longrope": lambda: (ModelConfig(**BASE, rope_scaling=longrope(32), hf_family="llama"), "llama",
                               {"rope_factors_long.weight"}),
    "llama_fixed_factors": lambda: (ModelConfig(**BASE, rope_scaling=longrope(32, fixed=True), hf_family="llama"),
                                    "llama", {"rope_freqs.weight"}),
    "phi3_fixed_factors": lambda: (hf_config("Phi3Config", rope_parameters={**longrope(32, fixed=True),
                                                                            "rope_theta": 1e4}), "phi3",
                                   {"rope_factors_short.weight"}),
    "llama_linear": lambda: (hf_config("LlamaConfig", rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                       "rope_theta": 1e4}), "llama", set()),
    "qwen2_yarn": lambda: (hf_config("Qwen2Config", rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                     "original_max_position_embeddings": 32,
                                                                     "rope_theta": 1e6, "attention_factor": 1.3}),
                           "qwen2", set()),
    "olmo2_windows_yarn": lambda: (hf_config("Olmo2Config", rope_theta=5e5).replace(
        sliding_window=8, layer_types=("sliding_attention", "sliding_attention", "full_attention"),
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        rope_local_base=5e5), "olmo2", set()),  # llama.cpp: plain RoPE of the global base on sliding layers
    "granite_no_rope": lambda: (hf_config("GraniteConfig", logits_scaling=2.0).replace(
        pos_embedding="none", rope_scaling=None), "granite", set()),
    "gemma2_local_base": lambda: (hf_config("Gemma2Config", head_dim=64, query_pre_attn_scalar=64, sliding_window=8,
                                            tie_word_embeddings=True).replace(rope_local_base=5000.0), "gemma2", set()),
    "llama_interleaved": lambda: (ModelConfig(**BASE, rope_style="interleaved", hf_family="llama"), "llama", set()),
    "qwen3_interleaved": lambda: (hf_config("Qwen3Config", head_dim=48).replace(rope_style="interleaved"), "qwen3",
                                  set()),
}


@pytest.fixture(scope="module")
def tokenizer(hf_tokenizer):
    return OurTokenizer.from_hf_dict(json.loads(hf_tokenizer.to_str()))


@pytest.mark.parametrize("name", VARIANTS)
def test_llama_cpp_runs_the_variant_as_scratchlm(tmp_path, tokenizer, name):
    config, arch, tensors = VARIANTS[name]()
    torch.manual_seed(0)
    model = randomize_family_(TransformerLM(config), gemma=config.norm_unit_offset).eval()
    path = save_gguf(model, tmp_path / "v.gguf", type_name="F32", tokenizer=tokenizer)
    contents = read_gguf(path)
    assert contents.metadata["general.architecture"] == arch and tensors <= set(contents.tensors)
    with torch.no_grad():
        want = model(torch.tensor([PROMPT]))[0]
        back = load_gguf(path)(torch.tensor([PROMPT]))[0]
    llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, verbose=False, n_threads=1, type_k=0, type_v=0)
    try:
        llm.eval(PROMPT)
        theirs = torch.from_numpy(np.array(llm.scores[:len(PROMPT)], dtype=np.float32))
    finally:
        llm.close()
    assert (theirs - want).abs().max() <= 1e-4 * want.abs().max()
    assert (back - want).abs().max() <= 1e-5 * want.abs().max()
