"""Session fixtures for the real-model tests: SmolLM2-135M-Instruct (Q4_1 GGUF) loaded once by scratchlm and
once by transformers (its own GGUF loader: the trusted reference), on one torch thread (batch-1 decoding gains
little from a second one, and one thread does not thrash when the 2 cores are shared)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smollm2(smollm2_gguf):
    """scratchlm's LoadedModel of the fixture as every command loads it: on the file's own ggml blocks."""
    from scratchlm.load import load_pretrained

    return load_pretrained(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_model(smollm2_gguf):
    """The fixture's TransformerLM alone (no tokenizer), dense: fp32 dequantized weights + model.quantized_weights."""
    from scratchlm.interop.gguf.model_load import load_gguf

    return load_gguf(smollm2_gguf, dtype=torch.float32)


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    """(model, tokenizer) transformers builds from the same GGUF file (dequantized to fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = smollm2_gguf.parent, smollm2_gguf.name
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(d, gguf_file=name)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield
