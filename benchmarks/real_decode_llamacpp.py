"""The llama.cpp side of real_decode.py: F16/Q8_0 copies of a GGUF (gguf-py) and a greedy llama-cpp-python loop.

`write_gguf(src, dst, "F16" | "Q8_0")` copies every metadata field of `src` and re-encodes each
quantized matrix from its dequantized fp32 values (gguf-py's `dequantize`, then `.astype(float16)` or
gguf-py's Q8_0 `quantize`, which follows ggml's reference rounding); 1-D tensors stay F32.
`LlamaCppEngine` decodes greedily one token per `llama_decode` call (llama-cpp-python's `eval`, the
last position's logits only) with n_threads = n_threads_batch = threads.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

FILE_TYPES = {"F16": 1, "Q8_0": 7}  # llama_ftype: MOSTLY_F16, MOSTLY_Q8_0


def write_gguf(src: Path, dst: Path, qtype: str) -> Path:
    """dst = src with every 2-D tensor re-encoded as qtype (F16 or Q8_0) from its dequantized values."""
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(FILE_TYPES[qtype])
    for t in reader.tensors:
        values = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        if values.ndim == 1 or values.shape[0] == 1:
            writer.add_tensor(t.name, values)
        elif qtype == "F16":
            writer.add_tensor(t.name, values.astype(np.float16))
        else:
            q = quantize(values, GGMLQuantizationType.Q8_0)
            writer.add_tensor(t.name, q, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


class LlamaCppEngine:
    """A llama-cpp-python context on one GGUF: greedy decoding and prefill timing."""

    def __init__(self, path: Path, threads: int = 2, n_ctx: int = 512) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                         n_threads_batch=threads, logits_all=False, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def last_logits(self) -> np.ndarray:
        return np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.n_vocab,))

    def greedy(self, prompt: list[int], n: int) -> tuple[float, list[int]]:
        """(seconds of the n - 1 decode steps after the prompt, the n greedy tokens)."""
        self.llm.reset()
        self.llm.eval(prompt)
        tokens = [int(np.argmax(self.last_logits()))]
        t0 = time.perf_counter()
        for _ in range(n - 1):
            self.llm.eval([tokens[-1]])
            tokens.append(int(np.argmax(self.last_logits())))
        return time.perf_counter() - t0, tokens

    def prefill(self, ids: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(ids)
        self.last_logits()

    def close(self) -> None:
        self.llm.close()
