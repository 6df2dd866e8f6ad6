"""Every llama.cpp architecture scratchlm reads and writes, end to end against independent references.

Per family (gguf_helpers.family_cases: a tiny random transformers model, widths partly not multiples of 256):
  export   `scratchlm convert --to-gguf --type f32` of the HF directory; llama.cpp (llama-cpp-python) runs the
           file with an F32 KV cache and gives transformers' logits (<= 1e-4 relative to the largest logit)
  quantize llama.cpp's own quantizer (llama_model_quantize, default params) writes Q4_K_M, Q5_K_M, Q3_K_M,
           Q2_K, IQ4_XS and Q4_0 files (K-quants and their fallbacks Q5_0 / Q5_1 / IQ4_NL / Q4_0 / Q8_0 / Q6_K)
  read     scratchlm loads each on its own blocks (and Q4_K_M dequantized too) and computes the logits of the
           dequantized weights: transformers on the same values (gguf-py's dequantizer, llama.cpp's tensor map;
           gguf_helpers.hf_with_gguf_weights) within 1e-4 relative, and 20 greedy tokens equal (the reference
           forward and decode="auto", the packed decoder on the blocks)
  models   `scratchlm models FILE` names the architecture, the block types and the tokenizer
Files are built once per family (module-scoped fixture) and shared by its tests.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from gguf_helpers import build_family_model, family_cases, hf_with_gguf_weights
from scratchlm.cli.main import main
from scratchlm.generate.engine import generate
from scratchlm.interop.gguf.model_load import load_gguf
from scratchlm.interop.gguf.writer import save_gguf

import llama_cpp  # in the test extra (pinned)

FTYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q3_K_M": 12, "Q2_K": 10, "IQ4_XS": 30, "Q4_0": 2}  # llama_ftype
GGML_F32 = 0  # llama.cpp's KV cache in fp32 (its default, f16, rounds K and V)
REL = 1e-4
N_NEW = 20
PROMPT = [(7 * i + 3) % 390 + 5 for i in range(24)]  # longer than phi3's L0 = 16 and gemma's window of 8
FAMILIES = list(family_cases(400))


@dataclass
class FamilyFiles:
    name: str
    arch: str
    hf: torch.nn.Module
    f32: Path
    quantized: dict[str, Path]


def quantize(src: Path, dst: Path, ftype: int) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, hf_tokenizer) -> FamilyFiles:
    name = request.param
    arch, hf = build_family_model(name, hf_tokenizer.get_vocab_size())
    d = tmp_path_factory.mktemp(f"gguf_{name}")
    hf.save_pretrained(d / "hf")
    hf_tokenizer.save(str(d / "hf" / "tokenizer.json"))
    f32 = d / f"{name}.f32.gguf"
    assert main(["convert", "--to-gguf", str(d / "hf"), "--out", str(f32), "--type", "f32"]) == 0
    quantized = {ft: quantize(f32, d / f"{name}.{ft}.gguf", code) for ft, code in FTYPES.items()}
    return FamilyFiles(name, arch, hf, f32, quantized)


@torch.no_grad()
def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, ids: list[int]) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                         do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_llama_cpp_runs_our_f32_export_as_transformers(family):
    meta = gguf.GGUFReader(str(family.f32)).fields
    assert bytes(meta["general.architecture"].parts[-1]).decode() == family.arch
    llm = llama_cpp.Llama(str(family.f32), n_ctx=256, logits_all=True, verbose=False, n_threads=1,
                          type_k=GGML_F32, type_v=GGML_F32)
    try:
        llm.eval(PROMPT)
        theirs = torch.from_numpy(np.array(llm.scores[:len(PROMPT)], dtype=np.float32))
    finally:
        llm.close()
    assert rel_error(theirs, hf_logits(family.hf, PROMPT)) <= REL
    # the same file on its F32 "blocks" (embedding rows read as floats by the C++ step), greedy as transformers
    expected = hf_greedy(family.hf, PROMPT)
    assert generate(load_gguf(family.f32), [PROMPT], N_NEW, decode="auto") == [expected]


@pytest.mark.parametrize("ftype", FTYPES)
def test_llama_cpp_quantized_file_on_its_blocks_equals_transformers(family, ftype):
    path = family.quantized[ftype]
    reference, types = hf_with_gguf_weights(path, family.hf, family.arch)
    model = load_gguf(path)  # dtype=None: every matrix (and expert tensor) stays in the file's blocks
    assert all(p.dim() == 1 for p in model.parameters())  # only norms and biases are float parameters
    want = hf_logits(reference, PROMPT)
    with torch.no_grad():
        assert rel_error(model(torch.tensor([PROMPT]))[0], want) <= REL
    expected = hf_greedy(reference, PROMPT)
    assert len(set(expected)) >= 3, "a degenerate continuation proves little"
    for decode in ("model", "auto"):  # the reference forward, and the packed decoder on the blocks (fast-gguf)
        assert generate(model, [PROMPT], N_NEW, decode=decode) == [expected], decode
    if ftype == "Q4_K_M":  # the dense path reads the same values; the block model writes back what it runs
        dense = load_gguf(path, dtype=torch.float32)
        with torch.no_grad():
            got = model(torch.tensor([PROMPT]))[0]
            assert rel_error(dense(torch.tensor([PROMPT]))[0], want) <= REL
            again = load_gguf(save_gguf(model, path.with_suffix(".back.gguf"), type_name="F32"), dtype=torch.float32)
            assert rel_error(again(torch.tensor([PROMPT]))[0], got) <= 1e-5
    assert len(set(types.values()) - {"F32"}) >= 2  # the quantizer mixed types (fallbacks for the narrow rows)


def test_models_cli_names_each_family(family, capsys):
    path = family.quantized["Q4_K_M"]
    assert main(["models", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors)
    assert lines[1].startswith(f"  architecture: {family.arch}, ")
    assert lines[2] == "  block types: " + ", ".join(f"{name} {n}" for name, n in counts.most_common())
    assert lines[3].startswith("  tokenizer: gpt2 (byte-level BPE), 400 tokens")
