"""Python entry points of the decode kernels: y (B, N) = x (B, K) @ W^T with W in a compact format.

`native_kernels()` is the compiled module or None; callers keep a torch fallback for None (same math:
F.linear on the dequantized fp32 matrix). The kernels take contiguous fp32 x and return fp32.
Every ggml block type quant/dequantize.py reads has an exact kernel (fp32 x times the block widened
exactly, kernels/csrc/blocks.h) and an 8-bit-activation ("A8 row") kernel on the blocks in place (x rounded
per block of the type first, integer dot products: kernels/csrc/gemv_a8_blocks.h); Q8_0 and Q4_1 also have
the repacked 16-row-interleaved A8 kernels (gemv_a8.h). A Q4_K, Q4_0, Q2_K or Q3_K matrix is read from a copy of
its blocks repacked 16 rows at a time where the build has gemv_fixed24.h (`repacked`, r16_layout.h / gemv_r16.h;
SCRATCHLM_REPACK=0: none); the copy replaces the blocks for every route.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import ModuleType

import torch

from scratchlm.kernels.build import native
from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.ggml_types import ggml_type

# matrix_ref.h's Format
FORMAT_CODES = {"F32": 0, "BF16": 1, "Q8_0": 2, "Q4_1": 3, "Q8_0_A8": 4, "Q4_1_A8": 5, "F16": 6, "Q4_0": 7,
                "Q5_0": 8, "Q5_1": 9, "IQ4_NL": 10, "Q2_K": 11, "Q3_K": 12, "Q4_K": 13, "Q5_K": 14, "Q6_K": 15,
                "IQ4_XS": 16}
A8_TYPES = ("Q8_0", "Q4_1")  # the block types with 8-bit-activation kernels
DENSE_K_MULTIPLE = 16  # F32 / F16 / BF16 rows are read 16 values at a time
A8_ROW = 32  # matrix_ref.h: a block type's code + A8_ROW = its A8 row form
DENSE_TYPES = ("F32", "F16", "BF16")


REPACK_ENV = "SCRATCHLM_REPACK"  # 0 / false / off / no: no repacked copies (memory the file's size, slower b1)
_REPACKED: dict[tuple[int, int, int], torch.Tensor] = {}  # (data_ptr, N, K) of a matrix's blocks -> its copy
_REPACKING = threading.Lock()  # decoders built on two threads at once make each copy once


def native_kernels() -> ModuleType | None:
    """The compiled kernel module (built once per machine and cached), or None."""
    return native()


def k_multiple(type_name: str) -> int:
    """The row length K must be a multiple of this for the type's exact kernel (16, 32 or 256)."""
    block = ggml_type(type_name).block_size
    return DENSE_K_MULTIPLE if block == 1 else block


def fits(blocks: GGMLBlocks) -> bool:
    """True when the exact kernel reads this matrix (its row length fits the type's kernel)."""
    return blocks.ggml_type in FORMAT_CODES and blocks.shape[1] % k_multiple(blocks.ggml_type) == 0


def check_fits(blocks: GGMLBlocks) -> None:
    if not fits(blocks):
        raise ValueError(f"no decode kernel for a {blocks.ggml_type!r} matrix of shape {blocks.shape}: its rows "
                         f"must be a multiple of {k_multiple(blocks.ggml_type)} values")


def code(type_name: str, a8: bool = False) -> int:
    """The kernels' format code of a ggml type; a8: its A8 row form (dense types have none: they stay exact)."""
    return FORMAT_CODES[type_name] + (A8_ROW if a8 and type_name not in DENSE_TYPES else 0)


def linear_blocks(mod: ModuleType, x: torch.Tensor, blocks: GGMLBlocks, a8: bool = False) -> torch.Tensor:
    """x (B, K) fp32 @ (blocks of an (N, K) matrix, any ggml type)^T -> (B, N) fp32, w widened exactly;
    a8: the A8 row kernel instead (x rounded per block first: quant/act_quant.round_act_blocks)."""
    check_fits(blocks)
    n, k = blocks.shape
    copy = None if a8 else _REPACKED.get(_key(blocks))
    return mod.linear_blocks(x, blocks.data, n, k, code(blocks.ggml_type, a8), copy)


def dequantize(mod: ModuleType, blocks: GGMLBlocks, out: torch.Tensor | None = None) -> torch.Tensor:
    """The (N, K) fp32 values the kernels multiply by (their own widening of the blocks; block types only),
    written into out (contiguous fp32, N * K values) when given."""
    check_fits(blocks)
    n, k = blocks.shape
    return mod.dequantize(blocks.data, n, k, FORMAT_CODES[blocks.ggml_type], out, _REPACKED.get(_key(blocks)))


def repack_enabled() -> bool:
    """False when the environment turns the repacked Q4_K / Q4_0 / Q2_K / Q3_K copies off (SCRATCHLM_REPACK=0): decoding
    then reads the file's blocks in place (gemv_fixed24*.h, ~0.85x the copy's speed on the 1B Q4_K_M file)."""
    return os.environ.get(REPACK_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def repacked_bytes(mod: ModuleType | None, blocks: GGMLBlocks) -> int:
    """Bytes of the copy `repacked` makes of this matrix, 0 where it makes none: it makes one of a Q4_K, Q4_0, Q2_K
    or Q3_K matrix on the CPU of whole 16-row groups, K a multiple of 256, where the build has gemv_fixed24.h
    (AVX512-VNNI) and copies are not turned off (SCRATCHLM_REPACK=0); Q4_K's copy is its blocks' bytes x 2368 / 2304,
    Q3_K's x 1824 / 1760, Q4_0's and Q2_K's as many (r16_layout.h)."""
    if mod is None or blocks.ggml_type not in FORMAT_CODES or blocks.data.device.type != "cpu" or not repack_enabled():
        return 0
    n, k = blocks.shape
    return int(mod.r16_copy_bytes(n, k, FORMAT_CODES[blocks.ggml_type]))


def _key(blocks: GGMLBlocks) -> tuple[int, int, int]:
    n, k = blocks.shape
    return blocks.data.data_ptr(), n, k


def repacked(mod: ModuleType, blocks: GGMLBlocks) -> torch.Tensor | None:
    """The copy of a Q4_K / Q4_0 / Q2_K / Q3_K matrix repacked 16 rows at a time (r16_layout.h), made once per matrix and shared by
    every `Linear` over it (the C++ step's and the packed layers'); None where `repacked_bytes` is 0.

    The copy then replaces the blocks: every kernel route reads it (one batch row through gemv_r16.h, the others
    widening it: csrc/weight_rows.h; `linear_blocks` and `dequantize` of the whole matrix too), and the file's pages
    under the matrix are dropped from the process (release_file_pages: only where they are a mapping of the file,
    which the kernel reads back if anything touches them again), so the process holds ~the file's size."""
    if repacked_bytes(mod, blocks) == 0:
        return None
    key = _key(blocks)
    with _REPACKING:
        if key not in _REPACKED:
            n, k = blocks.shape
            _REPACKED[key] = mod.repack_r16(blocks.data, n, k, FORMAT_CODES[blocks.ggml_type])
            weakref.finalize(blocks.data, _REPACKED.pop, key, None)  # dropped with the matrix it was made from
            mod.release_file_pages(blocks.data)
        return _REPACKED[key]


def repack_stack(mod: ModuleType, stacked: GGMLBlocks, parts: list[GGMLBlocks]) -> None:
    """Repack a stacked matrix once (a GGUF expert tensor: E experts' matrices stacked by rows) and let each part
    (an expert's rows: a view into `stacked`'s bytes, rows a multiple of 16) read its slice of that copy through
    `repacked` (the copy's 16-row groups lie in row order, so a part's groups are one contiguous run). One copy and
    one page release for all E experts instead of one per expert (each ~1 ms of fixed cost: 128 experts x 3 tensors
    x 48 layers of Qwen3-30B-A3B)."""
    if all(_key(p) in _REPACKED for p in parts):  # made before (another decoder of the same model)
        return
    whole = repacked(mod, stacked)
    if whole is None:
        return
    n, _ = stacked.shape
    group = whole.numel() // (n // 16)  # bytes of one 16-row group (all K)
    base, row_bytes = stacked.data.data_ptr(), stacked.data.shape[1]
    with _REPACKING:
        for p in parts:
            offset, rows = p.data.data_ptr() - base, p.shape[0]
            row0 = offset // row_bytes
            if (offset % row_bytes or row0 % 16 or rows % 16 or not 0 <= row0 <= n - rows
                    or p.data.shape[1] != row_bytes or _key(p) in _REPACKED):
                continue
            _REPACKED[_key(p)] = whole[row0 // 16 * group:(row0 + rows) // 16 * group]
            weakref.finalize(p.data, _REPACKED.pop, _key(p), None)


def block_linear(mod: ModuleType, parts: tuple[GGMLBlocks, ...] | list[GGMLBlocks],
                 in_scale: torch.Tensor | None = None, out_scale: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None, a8: bool = False) -> object:
    """The kernels' `Linear` over row parts stacked top to bottom, each in its own type (csrc/linear.h):
    `.forward(x)` = ((x * in_scale) @ [W_1; W_2; ...]^T) * out_scale + bias, every W_i widened exactly;
    a8: the block parts' A8 row kernels (x * in_scale rounded per block of each part's type first)."""
    for p in parts:
        check_fits(p)
    k = parts[0].shape[1]
    if any(p.shape[1] != k for p in parts):
        raise ValueError(f"stacked parts need one row length, got {[p.shape for p in parts]}")
    r16 = [None if a8 else repacked(mod, p) for p in parts]
    return mod.Linear([code(p.ggml_type, a8) for p in parts], [p.data for p in parts],
                      [p.shape[0] for p in parts], k, in_scale, out_scale, bias, r16)


def a8_linear(mod: ModuleType, blocks: GGMLBlocks, in_scale: torch.Tensor | None = None,
              out_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> object:
    """The kernels' `Linear` for Q8_0 / Q4_1 blocks in their A8 format (repacked once, see gemv_a8.h):
    `.forward(x)` = (round_act(x * in_scale) @ W^T) * out_scale + bias, quant/act_quant.py's function."""
    if blocks.ggml_type not in A8_TYPES:
        raise ValueError(f"no 8-bit-activation kernel for ggml type {blocks.ggml_type!r}; kernels read Q8_0 and Q4_1")
    n, k = blocks.shape
    return mod.Linear([FORMAT_CODES[blocks.ggml_type + "_A8"]], [blocks.data], [n], k, in_scale, out_scale, bias)
