"""Session fixtures for the real-model tests: SmolLM2-135M-Instruct (Q4_1 GGUF) loaded once by scratchlm and
once by transformers (its own GGUF loader: the trusted reference), on one torch thread (batch-1 decoding gains
little from a second one, and one thread does not thrash when the 2 cores are shared)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_model


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


def _shared_dir(tmp_path_factory) -> Path:
    """A directory of this test session that every xdist worker sees (each worker has its own basetemp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf, tmp_path_factory):
    """(model, tokenizer) transformers builds from the same GGUF file (dequantized to fp32).

    transformers' GGUF loader takes ~40 s here (gguf-py parses the file's metadata three times): the first
    worker to need it converts once and saves transformers' own model and tokenizer (save_pretrained); every
    worker loads that copy (~2 s). The
    test below that compares weights checks the copy against the file's dequantized tensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _shared_dir(tmp_path_factory) / "hf_smollm2_from_gguf"
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker converts; the others wait for its copy
        if not (target / "complete").is_file():
            d, name = smollm2_gguf.parent, smollm2_gguf.name
            model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
            # transformers refuses save_pretrained on a GGUF-loaded model: its config and weights as they are
            target.mkdir()
            del model.config.quantization_config
            model.config.save_pretrained(target)
            save_model(model, str(target / "model.safetensors"))
            AutoTokenizer.from_pretrained(d, gguf_file=name).save_pretrained(target)
            (target / "complete").touch()
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(target)


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield
