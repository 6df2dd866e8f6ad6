"""llama.cpp's own ggml C library (libggml-base.so from the llama-cpp-python package), through ctypes:
its quantizer (`ggml_quantize_chunk`), its reference dequantizers (`dequantize_row_*`) and its type traits.

The library is located without importing `llama_cpp` (which would load libllama too); a missing package
or library is an error, not a skip: llama-cpp-python is a test dependency.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

import numpy as np

from scratchlm.quant.ggml_types import ggml_type


@cache
def libggml() -> ctypes.CDLL:
    """libggml-base.so with the signatures used here declared."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llama-cpp-python (the llama_cpp package) is not installed; it is a test dependency")
    path = Path(next(iter(spec.submodule_search_locations))) / "lib" / "libggml-base.so"
    if not path.is_file():
        raise FileNotFoundError(f"llama-cpp-python ships no {path}")
    lib = ctypes.CDLL(str(path))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ptr, ptr, i64, i64, i64, ptr]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_blck_size.argtypes = [ctypes.c_int]
    lib.ggml_blck_size.restype = i64
    lib.ggml_type_size.argtypes = [ctypes.c_int]
    lib.ggml_type_size.restype = ctypes.c_size_t
    return lib


def c_type_traits(type_id: int) -> tuple[str, int, int]:
    """ggml's (name, values per block, bytes per block) for a type id; name as ggml spells it ("q2_K")."""
    lib = libggml()
    return lib.ggml_type_name(type_id).decode(), int(lib.ggml_blck_size(type_id)), int(lib.ggml_type_size(type_id))


def requires_imatrix(type_name: str) -> bool:
    return bool(libggml().ggml_quantize_requires_imatrix(ggml_type(type_name).type_id))


def quantize(x: np.ndarray, type_name: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """(rows, cols) float32 -> (rows, row_bytes) uint8 written by `ggml_quantize_chunk` (llama.cpp's quantizer,
    the one `llama_model_quantize` calls per tensor); imatrix: (cols,) importance weights, or None."""
    t = ggml_type(type_name)
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    out = np.zeros((rows, t.row_bytes(cols)), dtype=np.uint8)
    qw = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
    if qw is not None and qw.shape != (cols,):
        raise ValueError(f"imatrix needs shape ({cols},), got {qw.shape}")
    written = libggml().ggml_quantize_chunk(t.type_id, x.ctypes.data, out.ctypes.data, 0, rows, cols,
                                            None if qw is None else qw.ctypes.data)
    if written != out.nbytes:
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes for {type_name} {x.shape}, "
                           f"expected {out.nbytes}")
    return out


def dequantize(raw: np.ndarray, type_name: str) -> np.ndarray:
    """(rows, row_bytes) uint8 blocks -> (rows, cols) float32 through ggml's own `dequantize_row_<type>`."""
    t = ggml_type(type_name)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    rows = raw.shape[0]
    cols = raw.shape[1] // t.type_size * t.block_size
    out = np.empty((rows, cols), dtype=np.float32)
    fn = getattr(libggml(), "dequantize_row_" + type_name.lower().replace("_k", "_K"))
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    fn(raw.ctypes.data, out.ctypes.data, rows * cols)
    return out
