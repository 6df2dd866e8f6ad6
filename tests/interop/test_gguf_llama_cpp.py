"""GGUF export read by llama.cpp itself (llama-cpp-python): the same logits and the same token ids.

llama.cpp runs F32 weights with an F32 KV cache in fp32 end to end, so its logits equal transformers' to
fp32 rounding; the quantized types also load (llama.cpp then rounds activations too: not compared)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from scratchlm.interop.gguf.writer import save_gguf
from scratchlm.load import from_pretrained
from scratchlm.tokenizer.pipeline import Tokenizer as OurTokenizer
from gguf_helpers import TEXTS, tiny_hf_model

import llama_cpp  # in the test extra (pinned): the fixture package requires it

GGML_F32 = 0  # ggml_type id: keep llama.cpp's KV cache in fp32 (its default, f16, rounds K and V)


def _llama(path, **kw):
    return llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1, **kw)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_llama_cpp_reads_our_export_with_transformers_logits_and_ids(tmp_path, hf_tokenizer, family):
    hf = tiny_hf_model(family, hf_tokenizer.get_vocab_size())
    hf.save_pretrained(tmp_path / "hf")
    tok = OurTokenizer.from_hf_dict(json.loads(hf_tokenizer.to_str()))
    ours = from_pretrained(tmp_path / "hf")
    stops = [tok.token_to_id("<|im_end|>")]
    path = save_gguf(ours, tmp_path / "m.gguf", type_name="F32", tokenizer=tok, stop_token_ids=stops)
    llm = _llama(path, type_k=GGML_F32, type_v=GGML_F32)
    try:
        for text in TEXTS:
            assert llm.tokenize(text.encode(), add_bos=False, special=True) == hf_tokenizer.encode(text).ids, text
        assert llm.token_eos() == stops[0]
        ids = hf_tokenizer.encode("ROMEO: to be or not to be, that is").ids
        llm.eval(ids)
        theirs = torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))
    finally:
        llm.close()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    assert (theirs - want).abs().max() <= 1e-4
    q8 = save_gguf(ours, tmp_path / "m.q8_0.gguf", type_name="Q8_0", tokenizer=tok, stop_token_ids=stops)
    llm = _llama(q8)
    try:
        assert llm.n_vocab() == hf_tokenizer.get_vocab_size() and llm.token_eos() == stops[0]
    finally:
        llm.close()
