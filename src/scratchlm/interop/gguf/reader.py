"""Read a GGUF file's metadata and tensor directory; tensor bytes stay in the file until they are used.

A GGUF file (llama.cpp's gguf.md; little endian) is

    magic "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64
    kv_count x   key (string) | value type u32 | value        string = u64 length + UTF-8 bytes
    tensor_count x  name (string) | n_dims u32 | ne[n_dims] u64 | ggml type u32 | data offset u64
    padding to `general.alignment` (default 32), then the tensor data; offsets count from there.

`read_gguf` parses the header only and hands back plain Python:
  * metadata: {key: int | float | bool | str | list} (e.g. "llama.block_count": 30), every key that
    scratchlm reads checked against its GGUF value type (METADATA_KINDS),
  * tensors: {GGUF name: GGUFTensor}; GGUF lists dimensions fastest-first (ne0 = row length), so a
    matrix stored as ne = [cols, rows] is (rows, cols) here, like torch's `Linear.weight` (out, in).
    Each tensor's bytes are a numpy view of the (private, copy-on-write) memory-mapped file, one row of ggml blocks per
    tensor row; nothing is read or copied until `.data`, `.dequantize()` or `.blocks()` asks.
The container is checked when it is read (a clear one-line ValueError naming the file): magic, version,
truncation, tensor data inside the file and not overlapping, row length a multiple of the type's block.
Whether scratchlm implements a tensor's type is asked later: `GGUFContents.check_tensor_types()` names
every unsupported tensor in one line, and using such a tensor's data raises that same error.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import torch

from scratchlm.quant.blocks import GGMLBlocks
from scratchlm.quant.dequantize import dequantize
from scratchlm.quant.ggml_types import GGML_TYPE_NAMES, ggml_type

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
_REDO = "download or convert it again"

# GGUF value type id -> (name, little-endian struct format); 8 = string, 9 = array
_SCALARS = {0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
            5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
            12: ("float64", "<d")}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_INTS = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"}
_NUMBERS = _INTS | {"float32", "float64"}
# what a key's value must be: (how an error says it, the GGUF value types accepted)
_KINDS = {
    "int": ("an integer", _INTS), "number": ("a number", _NUMBERS), "bool": ("a bool", {"bool"}),
    "str": ("a string", {"string"}), "u32": ("a uint32", {"uint32"}),
    "int|ints": ("an integer or an array of integers", _INTS | {f"array[{k}]" for k in _INTS}),
    "strs": ("an array of strings", {"array[string]"}),
    "ints": ("an array of integers", {f"array[{k}]" for k in _INTS}),
    "numbers": ("an array of numbers", {f"array[{k}]" for k in _NUMBERS}),
}
# the keys scratchlm reads (metadata_config.py, tokenizer_metadata.py, load/) and the value each must hold
METADATA_KINDS = {
    "general.architecture": "str", "general.name": "str", "general.alignment": "u32",
    "general.sampling.temp": "number", "general.sampling.top_k": "int", "general.sampling.top_p": "number",
    "general.sampling.min_p": "number", "general.sampling.penalty_repeat": "number",
    "tokenizer.ggml.model": "str", "tokenizer.ggml.pre": "str", "tokenizer.ggml.tokens": "strs",
    "tokenizer.ggml.merges": "strs", "tokenizer.ggml.token_type": "ints", "tokenizer.ggml.scores": "numbers",
    **{f"tokenizer.ggml.{k}_token_id": "int" for k in ("bos", "eos", "eot", "eom", "unknown", "padding")},
    "tokenizer.ggml.add_bos_token": "bool", "tokenizer.ggml.add_eos_token": "bool",
    "tokenizer.ggml.add_space_prefix": "bool", "tokenizer.chat_template": "str",
}
ARCH_METADATA_KINDS = {  # "{general.architecture}.KEY"
    "block_count": "int", "context_length": "int", "embedding_length": "int", "feed_forward_length": "int|ints",
    "attention.head_count": "int|ints", "attention.head_count_kv": "int|ints", "attention.key_length": "int",
    "attention.value_length": "int", "attention.layer_norm_rms_epsilon": "number", "rope.freq_base": "number",
    "rope.dimension_count": "int", "vocab_size": "int", "expert_count": "int", "attention.sliding_window": "int",
    "rope.scaling.type": "str", "rope.scaling.factor": "number", "attention.clamp_kqv": "number",
    "attn_logit_softcapping": "number", "final_logit_softcapping": "number",
}


def _supported(type_id: int) -> bool:
    try:
        ggml_type(type_id)
    except ValueError:
        return False
    return True


def _layout(type_id: int) -> tuple[str, int, int] | None:
    """(name, values per block, bytes per block) of a ggml type id, supported or not; None: no ggml type."""
    if _supported(type_id):
        t = ggml_type(type_id)
        return t.name, t.block_size, t.type_size
    try:
        kind = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        return None
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return kind.name, block, size


def supported_type_names() -> list[str]:
    """The ggml types scratchlm reads, in id order (from quant/ggml_types.py)."""
    return [t.name for t in gguf.GGMLQuantizationType if _supported(t.value)]


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    return math.prod(shape[:-1]), (shape[-1] if shape else 1)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its ggml type (name, or the raw id when it is no ggml type), torch-order
    shape, and `raw`, a uint8 view of its bytes in the privately memory-mapped file (None when the type's
    block size is unknown)."""

    name: str
    type_name: str | int
    shape: tuple[int, ...]
    type_id: int = -1
    offset: int = 0  # of the first byte in the file
    raw: np.ndarray | None = field(default=None, repr=False, compare=False)
    check_file: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    @property
    def supported(self) -> bool:
        """True when scratchlm implements this tensor's ggml type."""
        return _supported(self.type_id)

    def _require_supported(self) -> None:
        if self.supported:
            return
        if self.check_file is not None:
            self.check_file()  # the file-wide error, naming every unsupported tensor
        raise ValueError(f"GGUF tensor {self.name}: {_type_words(self.type_name)} is not supported by scratchlm; "
                         f"supported types: {', '.join(supported_type_names())}")

    @property
    def data(self) -> torch.Tensor:
        """The file's bytes unchanged, uint8 (rows, row_bytes) (a copy, made now)."""
        if self.raw is None:
            self._require_supported()
        _, block, size = _layout(self.type_id)
        rows, cols = _rows_cols(self.shape)
        return torch.from_numpy(self.raw.reshape(rows, cols // block * size).copy())

    def view(self) -> torch.Tensor:
        """The file's bytes as uint8 (rows, row_bytes) WITHOUT a copy: a torch view of the mapped file.

        Pages are read on first touch and shared with the OS page cache (and with every process mapping
        the file); the mapping is private (copy-on-write), so nothing written here ever reaches the file."""
        if self.raw is None:
            self._require_supported()
        _, block, size = _layout(self.type_id)
        rows, cols = _rows_cols(self.shape)
        return torch.from_numpy(self.raw.reshape(rows, cols // block * size))

    def dequantize(self) -> torch.Tensor:
        """The values as float32, shaped `shape` (bit-exact ggml dequantization)."""
        self._require_supported()
        return dequantize(self.data, self.type_name, self.shape)

    def blocks(self) -> GGMLBlocks:
        """The raw rows of a 2-D tensor as GGMLBlocks (for decode kernels that read ggml blocks)."""
        if len(self.shape) != 2:
            raise ValueError(f"GGUF tensor {self.name} has shape {self.shape}; only matrices carry GGMLBlocks")
        self._require_supported()
        return GGMLBlocks(self.type_name, self.data, (self.shape[0], self.shape[1]))


def _type_words(type_name: str | int) -> str:
    return f"unknown ggml type id {type_name}" if isinstance(type_name, int) else f"type {type_name}"


def _tensor_group(type_name: str | int, names: list[str]) -> str:
    if len(names) == 1:
        return f"tensor {names[0]} of {_type_words(type_name)}"
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} tensors of {_type_words(type_name)} ({shown})"


@dataclass(frozen=True)
class GGUFContents:
    """A GGUF file's metadata (with each key's GGUF value type) and tensor directory."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    version: int = 3
    value_types: dict[str, str] = field(default_factory=dict)  # key -> "uint32", "string", "array[string]", ...

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def type_counts(self) -> dict[str | int, int]:
        """{ggml type name (or unknown id): number of tensors}, most frequent first."""
        counts: dict[str | int, int] = {}
        for t in self.tensors.values():
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def check_tensor_types(self) -> None:
        """ValueError naming, in one line, every tensor whose ggml type scratchlm does not implement."""
        groups: dict[str | int, list[str]] = {}
        for t in self.tensors.values():
            if not t.supported:
                groups.setdefault(t.type_name, []).append(t.name)
        if not groups:
            return
        n = sum(len(names) for names in groups.values())
        raise ValueError(f"GGUF file {self.path}: {' and '.join(_tensor_group(k, v) for k, v in groups.items())} "
                         f"{'is' if n == 1 else 'are'} not supported by scratchlm; supported types: "
                         f"{', '.join(supported_type_names())}; pick a file quantized to those or re-quantize it "
                         "(llama.cpp's llama-quantize)")


def is_gguf_file(path: str | Path) -> bool:
    """True when `path` is a file that starts with the GGUF magic bytes."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


class _Header:
    """A cursor over the mapped file that reads GGUF's header fields; clear errors at the file's end."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.size, self.pos = buf, path, len(buf), 0

    def error(self, problem: str) -> ValueError:
        return ValueError(f"GGUF file {self.path}: {problem}")

    def take(self, n: int, what: str) -> int:
        start = self.pos
        if n > self.size - start:
            raise self.error(f"the file is truncated: it ends at byte {self.size}, inside {what} (at byte {start}, "
                             f"{n} bytes); {_REDO}")
        self.pos += n
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.buf, self.take(8, what))[0]

    def string(self, what: str) -> str:
        n = self.u64(what)
        start = self.take(n, what)
        try:
            return str(self.buf[start:start + n], "utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} is not UTF-8 text; the file is corrupt, {_REDO}") from None

    def value(self, vtype: int, what: str) -> tuple[Any, str]:
        """(value, GGUF type name) of one metadata value of type `vtype`."""
        if vtype == _STRING:
            return self.string(what), "string"
        if vtype in _SCALARS:
            name, fmt = _SCALARS[vtype]
            return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0], name
        if vtype != _ARRAY:
            raise self.error(f"{what} has value type {vtype}, which GGUF does not define (0-12); the file is corrupt")
        etype, n = self.u32(what), self.u64(what)
        if etype in _SCALARS:
            name, fmt = _SCALARS[etype]
            start = self.take(n * struct.calcsize(fmt), what)
            return np.frombuffer(self.buf, np.dtype(fmt), n, start).tolist(), f"array[{name}]"
        if etype != _STRING:  # arrays of arrays: llama.cpp does not read them either
            raise self.error(f"{what} is an array of value type {etype}; GGUF arrays hold numbers, bools or strings")
        if n * 8 > self.size - self.pos:  # a string takes 8 bytes at least: no loop over a corrupt count
            self.take(n * 8, what)  # raises: the file is truncated
        return [self.string(what) for _ in range(n)], "array[string]"


def _read_metadata(h: _Header, count: int) -> tuple[dict[str, Any], dict[str, str]]:
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for i in range(count):
        key = h.string(f"the key of metadata entry {i}")
        if key in metadata:
            raise h.error(f"metadata key {key} appears twice; the file is corrupt, {_REDO}")
        metadata[key], types[key] = h.value(h.u32(f"metadata {key}"), f"metadata {key}")
    return metadata, types


def _value_words(vtype: str) -> str:
    """A GGUF value type in words: "a uint32", "an array of strings", "an array of int32 values"."""
    if vtype.startswith("array["):
        inner = vtype[6:-1]
        return f"an array of {'strings' if inner == 'string' else f'{inner} values'}"
    return f"{'an' if vtype[0] in 'aeio' else 'a'} {vtype}"  # a uint32, an int32


def _check_metadata_types(h: _Header, metadata: dict[str, Any], types: dict[str, str]) -> None:
    """Every key scratchlm reads holds the GGUF value type it is read as (METADATA_KINDS)."""
    arch = metadata.get("general.architecture")
    expected = dict(METADATA_KINDS)
    if isinstance(arch, str):
        expected.update({f"{arch}.{k}": kind for k, kind in ARCH_METADATA_KINDS.items()})
    for key, kind in expected.items():
        words, accepted = _KINDS[kind]
        if key in types and types[key] not in accepted:
            shown = repr(metadata[key])
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise h.error(f"metadata {key} is {_value_words(types[key])} ({shown}) but must be {words}; the file "
                          f"is corrupt or written by a broken converter, {_REDO}")


def _read_directory(h: _Header, count: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    """[(name, torch-order shape, ggml type id, offset in the data section)] in file order."""
    out, seen = [], set()
    for i in range(count):
        name = h.string(f"the name of tensor {i}")
        if name in seen:
            raise h.error(f"tensor {name} appears twice in the tensor directory; the file is corrupt, {_REDO}")
        seen.add(name)
        n_dims = h.u32(f"tensor {name}'s dimension count")
        if n_dims > MAX_DIMS:
            raise h.error(f"tensor {name} has {n_dims} dimensions, more than GGUF's {MAX_DIMS}; the file is corrupt")
        ne = [h.u64(f"tensor {name}'s shape") for _ in range(n_dims)]
        type_id, offset = h.u32(f"tensor {name}'s type"), h.u64(f"tensor {name}'s data offset")
        out.append((name, tuple(reversed(ne)), type_id, offset))
    return out


def _tensor_span(h: _Header, name: str, shape: tuple[int, ...], type_id: int, offset: int, data_start: int,
                 align: int) -> tuple[int, int]:
    """(first byte, end) of a tensor's data in the file, checked against its type, shape and the file's size."""
    start = data_start + offset
    if offset % align:
        raise h.error(f"tensor {name}'s data offset {offset} is not a multiple of the alignment {align}; the file "
                      f"is corrupt, {_REDO}")
    if start > h.size:
        raise h.error(f"tensor {name}'s data starts at byte {start}, past the end of the file ({h.size} bytes); "
                      f"the file is truncated or its tensor directory is corrupt, {_REDO}")
    layout = _layout(type_id)
    if layout is None:
        return start, start  # size unknown: check_tensor_types names the type
    type_name, block, size = layout
    rows, cols = _rows_cols(shape)
    if cols % block:
        raise h.error(f"tensor {name} ({type_name}, shape {shape}) has rows of {cols} values, not a whole number "
                      f"of {type_name} blocks ({block} values each): its shape does not match its type; the file "
                      f"is corrupt, {_REDO}")
    end = start + rows * (cols // block) * size
    if end > h.size:
        raise h.error(f"the file is truncated: tensor {name} ({type_name}, shape {shape}) needs bytes {start} to "
                      f"{end} but the file ends at byte {h.size}; {_REDO}")
    return start, end


def _check_overlaps(h: _Header, spans: dict[str, tuple[int, int]]) -> None:
    ordered = sorted(spans.items(), key=lambda kv: kv[1])
    for (a, (_, a_end)), (b, (b_start, _)) in zip(ordered, ordered[1:]):
        if a_end > b_start:
            raise h.error(f"tensor {a}'s data (its shape and type make it end at byte {a_end}) runs into tensor "
                          f"{b}'s (from byte {b_start}): a tensor's size does not match its shape and type; the "
                          f"file is corrupt, {_REDO}")


def _read_header(h: _Header) -> tuple[int, dict[str, Any], dict[str, str], list, int]:
    h.take(4, "the magic")
    version = h.u32("the version")
    if version & 0xFFFF == 0 and version:
        raise h.error("it is a big-endian GGUF file; scratchlm reads little-endian GGUF files only")
    if version not in GGUF_VERSIONS:
        raise h.error(f"GGUF version {version} is not supported; scratchlm reads versions "
                      f"{' and '.join(map(str, GGUF_VERSIONS))}; convert the model again with a current llama.cpp")
    n_tensors, n_kv = h.u64("the tensor count"), h.u64("the metadata count")
    if n_kv * 12 + n_tensors * 24 > h.size:  # the smallest entry of each: the counts are corrupt
        raise h.error(f"the header announces {n_tensors} tensors and {n_kv} metadata entries, more than a "
                      f"{h.size}-byte file holds; the file is truncated or corrupt, {_REDO}")
    metadata, types = _read_metadata(h, n_kv)
    _check_metadata_types(h, metadata, types)
    directory = _read_directory(h, n_tensors)
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if align <= 0 or align & (align - 1):
        raise h.error(f"metadata general.alignment={align} is not a power of two; the file is corrupt")
    return version, metadata, types, directory, -(-h.pos // align) * align


def read_gguf(path: str | Path) -> GGUFContents:
    """Parse `path`'s header (metadata + tensor directory; tensor bytes stay mapped, unread); one-line
    ValueErrors naming the file for anything that is not a well-formed GGUF file (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    with open(path, "rb") as f:
        start = f.read(4)
        if start != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file: it starts with {start!r}, not the magic bytes "
                             f"{GGUF_MAGIC!r}; pass a .gguf file (or a model directory)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: views never write the file
    h = _Header(buf, path)
    version, metadata, types, directory, data_start = _read_header(h)
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    spans = {name: _tensor_span(h, name, shape, tid, off, data_start, align) for name, shape, tid, off in directory}
    _check_overlaps(h, spans)
    data = np.frombuffer(buf, dtype=np.uint8)  # writable pages of the private mapping
    tensors: dict[str, GGUFTensor] = {}
    contents = GGUFContents(path, metadata, tensors, version, types)
    for name, shape, type_id, _ in directory:
        layout = _layout(type_id)
        start, end = spans[name]
        type_name = layout[0] if layout else GGML_TYPE_NAMES.get(type_id, type_id)
        tensors[name] = GGUFTensor(name, type_name, shape, type_id, start,
                                   data[start:end] if layout else None, contents.check_tensor_types)
    return contents
