"""Read a GGUF file into plain Python: metadata values and raw tensor bytes in torch's row order.

The container is parsed by the `gguf` package (llama.cpp's own reader); this module only turns what it
returns into scratchlm's terms:
  * metadata: {key: int | float | bool | str | list} (e.g. "llama.block_count": 30),
  * tensors: {GGUF name: GGUFTensor}; GGUF lists dimensions fastest-first (ne0 = row length), so a
    matrix stored as ne = [cols, rows] is (rows, cols) here, like torch's `Linear.weight` (out, in).
    `data` holds the file's bytes unchanged, one row of ggml blocks per tensor row: uint8 (rows, row_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import dequantize
from scratchlm.quant.ggml_types import ggml_type

GGUF_MAGIC = b"GGUF"


class _ArrayReader(gguf.GGUFReader):
    """gguf.GGUFReader over a plain ndarray view of its memory map (the same bytes).

    GGUFReader reads metadata in ~250k tiny slices for a 50k-token vocabulary; each slice of a numpy
    memmap runs memmap.__array_finalize__, which made reading SmolLM2's header ~3x slower (7.4 s vs 2.5 s)."""

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = value.view(np.ndarray)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its ggml type, torch-order shape and raw bytes (rows, row_bytes)."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    data: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The values as float32, shaped `shape` (bit-exact ggml dequantization)."""
        return dequantize(self.data, self.type_name, self.shape)

    def blocks(self) -> GGMLBlocks:
        """The raw rows of a 2-D tensor as GGMLBlocks (for decode kernels that read ggml blocks)."""
        if len(self.shape) != 2:
            raise ValueError(f"GGUF tensor {self.name} has shape {self.shape}; only matrices carry GGMLBlocks")
        return GGMLBlocks(self.type_name, self.data, (self.shape[0], self.shape[1]))


@dataclass(frozen=True)
class GGUFContents:
    """A GGUF file's metadata and tensors."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


def is_gguf_file(path: str | Path) -> bool:
    """True when `path` is a file that starts with the GGUF magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _tensor(reader_tensor: Any) -> GGUFTensor:
    name = reader_tensor.name
    try:
        kind = reader_tensor.tensor_type
        t = ggml_type(getattr(kind, "name", None) or int(kind))
    except ValueError as exc:
        raise ValueError(f"GGUF tensor {name!r}: {exc}") from None
    shape = tuple(int(d) for d in reversed(reader_tensor.shape.tolist()))  # ne is fastest-first
    cols = shape[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    raw = np.ascontiguousarray(reader_tensor.data).view(np.uint8).reshape(rows, t.row_bytes(cols))
    return GGUFTensor(name, t.name, shape, torch.from_numpy(raw.copy()))


def read_gguf(path: str | Path) -> GGUFContents:
    """Parse `path` (metadata + every tensor's bytes, copied into memory); clear errors for non-GGUF files."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    if not is_gguf_file(path):
        raise ValueError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
    try:
        reader = _ArrayReader(path)
    except (ValueError, IndexError, OSError) as exc:
        raise ValueError(f"{path}: cannot read this GGUF file ({exc}); is it truncated or from a newer llama.cpp?") from None
    metadata = {key: field.contents() for key, field in reader.fields.items()}
    tensors = {t.name: _tensor(t) for t in reader.tensors}
    return GGUFContents(path, metadata, tensors)
