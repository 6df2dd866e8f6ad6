"""GGUF reading: the header is parsed lazily, and every malformed file is one clear line naming the file.

The malformed files are written by hand (struct.pack, following llama.cpp's gguf.md) or by patching the bytes
of a small valid file written with gguf-py's GGUFWriter; each is read with `read_gguf` (the ValueError names
the file and the problem) and given to `scratchlm models` (exit 2, one line on stderr, no traceback).
"""

from __future__ import annotations

import re
import struct
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from scratchlm.cli.main import main
from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.interop.gguf.tokenizer_metadata import tokenizer_json_from_gguf
from scratchlm.load import load_pretrained

Q8_0, IQ2_XXS = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.IQ2_XXS
LLAMA = {"llama.block_count": 1, "llama.context_length": 32, "llama.embedding_length": 64,
         "llama.feed_forward_length": 96, "llama.attention.head_count": 4,
         "llama.attention.layer_norm_rms_epsilon": 1e-5}
TOKENS = ["a", "b", "ab", "<|end|>"]


# --- hand-written GGUF (gguf.md): strings are u64 length + UTF-8; value types 4 u32, 5 i32, 6 f32, 8 string, 9 array
def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, value) -> bytes:
    if isinstance(value, str):
        return _s(key) + struct.pack("<I", 8) + _s(value)
    if isinstance(value, float):
        return _s(key) + struct.pack("<If", 6, value)
    if isinstance(value, int):
        return _s(key) + struct.pack("<II", 4, value)
    if all(isinstance(v, str) for v in value):
        return _s(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_s(v) for v in value)
    return _s(key) + struct.pack("<IIQ", 9, 5, len(value)) + struct.pack(f"<{len(value)}i", *value)


def tensor_info(name: str, ne: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return _s(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, type_id, offset)


def hand_gguf(path: Path, kvs: list[bytes], version: int = 3, magic: bytes = b"GGUF",
              version_bytes: bytes | None = None) -> Path:
    """A GGUF with `kvs` and two tensors: w (F32, ne [8, 2]) and b (F32, ne [8]), aligned to 32."""
    infos = [tensor_info("w", (8, 2), 0, 0), tensor_info("b", (8,), 0, 64)]
    head = magic + (version_bytes or struct.pack("<I", version)) + struct.pack("<QQ", len(infos), len(kvs))
    head += b"".join(kvs) + b"".join(infos)
    head += b"\0" * (-len(head) % 32)
    data = np.arange(16, dtype=np.float32).tobytes() + np.full(8, 0.5, np.float32).tobytes()
    path.write_bytes(head + data)
    return path


# --- a small valid file from gguf-py's writer, then patched
def writer_gguf(path: Path, arch: str = "llama", weight_type=Q8_0, n_weights: int = 1,
                tokenizer_model: str = "gpt2") -> Path:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("Tiny")
    for key, value in LLAMA.items():
        key = key.replace("llama.", f"{arch}.")
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(key, value)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(TOKENS)
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    if tokenizer_model == "llama":
        w.add_token_scores([0.0, -1.0, -2.0, 0.0])
    w.add_eos_token_id(3)
    for i in range(n_weights):
        name = "token_embd.weight" if i == 0 else f"blk.0.{['attn_q', 'attn_k', 'attn_v', 'attn_output'][i - 1]}.weight"
        if weight_type == Q8_0:
            data = gguf.quants.quantize(rng.standard_normal((8, 64)).astype(np.float32), Q8_0)
        else:
            block, size = gguf.GGML_QUANT_SIZES[weight_type]
            data = rng.integers(0, 256, (8, 256 // block * size), dtype=np.uint8)
        w.add_tensor(name, data, raw_dtype=weight_type)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def directory_entry(raw: bytes, name: str) -> tuple[int, int, int, int]:
    """(position of ne[0], n_dims, position of the type id, position of the data offset) of tensor `name`."""
    at = raw.index(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
    n_dims = struct.unpack_from("<I", raw, at)[0]
    dims = at + 4
    return dims, n_dims, dims + 8 * n_dims, dims + 8 * n_dims + 4


def patched(src: Path, dst: Path, name: str, field: str, value: int) -> Path:
    raw = bytearray(src.read_bytes())
    dims, _, type_pos, offset_pos = directory_entry(bytes(raw), name)
    fields = {"ne0": (dims, "<Q"), "ne1": (dims + 8, "<Q"), "type": (type_pos, "<I"), "offset": (offset_pos, "<Q")}
    at, fmt = fields[field]
    struct.pack_into(fmt, raw, at, value)
    dst.write_bytes(bytes(raw))
    return dst


@pytest.fixture
def valid(tmp_path) -> Path:
    return writer_gguf(tmp_path / "valid.gguf")


def assert_cli_one_line(path: Path, capsys, *needles: str) -> str:
    """`scratchlm models PATH` exits 2 with one line on stderr that names the file and holds `needles`;
    returns what it printed on stdout."""
    capsys.readouterr()
    assert main(["models", str(path)]) == 2
    out, err = capsys.readouterr()
    assert len(err.splitlines()) == 1 and err.startswith("scratchlm models: error: "), err
    assert str(path) in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return out


def test_hand_written_file_reads_exactly_and_lazily(tmp_path):
    entries = [kv("general.architecture", "llama"), kv("llama.block_count", 1), kv("tokenizer.ggml.tokens", TOKENS),
               kv("tokenizer.ggml.token_type", [1, 2, 3, 4]), kv("llama.attention.layer_norm_rms_epsilon", 1e-5)]
    path = hand_gguf(tmp_path / "h.gguf", entries)
    contents = read_gguf(path)
    assert contents.version == 3
    assert contents.metadata["general.architecture"] == "llama" and contents.metadata["llama.block_count"] == 1
    assert contents.metadata["tokenizer.ggml.tokens"] == TOKENS
    assert contents.metadata["tokenizer.ggml.token_type"] == [1, 2, 3, 4]
    assert contents.metadata["llama.attention.layer_norm_rms_epsilon"] == float(np.float32(1e-5))
    assert contents.value_types["tokenizer.ggml.tokens"] == "array[string]"
    assert contents.value_types["llama.block_count"] == "uint32"
    w, b = contents.tensors["w"], contents.tensors["b"]
    assert (w.type_name, w.shape, b.shape) == ("F32", (2, 8), (8,))
    # the bytes are a view of the privately mapped file, not a copy; using them warns about nothing
    assert not w.raw.flags.owndata
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(w.dequantize(), torch.arange(16, dtype=torch.float32).reshape(2, 8))
        assert torch.equal(b.dequantize(), torch.full((8,), 0.5))
        view = w.view()  # zero-copy torch view (what a model on the file's blocks holds)
    before = path.read_bytes()
    view[0, :4] = 255  # the mapping is copy-on-write: a write never reaches the file
    assert path.read_bytes() == before and int(w.raw[0]) == 255
    assert w.data.shape == (2, 32) and w.data.dtype == torch.uint8


def test_unsupported_types_do_not_stop_reading_and_are_named_all_at_once(tmp_path):
    path = writer_gguf(tmp_path / "iq.gguf", weight_type=IQ2_XXS, n_weights=5)
    contents = read_gguf(path)  # the header reads: metadata, tokenizer, tensor directory
    assert contents.metadata["general.name"] == "Tiny"
    assert tokenizer_json_from_gguf(contents.metadata)["model"]["vocab"] == {t: i for i, t in enumerate(TOKENS)}
    assert contents.type_counts() == {"IQ2_XXS": 5, "F32": 1}
    embd = contents.tensors["token_embd.weight"]
    assert (embd.type_name, embd.shape, embd.supported) == ("IQ2_XXS", (8, 256), False)
    assert torch.equal(contents.tensors["output_norm.weight"].dequantize(), torch.ones(64))
    want = (f"GGUF file {path}: 5 tensors of type IQ2_XXS (token_embd.weight, blk.0.attn_q.weight, "
            "blk.0.attn_k.weight and 2 more) are not supported by scratchlm; supported types: F32, F16, ")
    with pytest.raises(ValueError) as exc:
        contents.check_tensor_types()
    assert str(exc.value).startswith(want) and "\n" not in str(exc.value)
    for use in (embd.dequantize, embd.blocks):  # using an unsupported tensor raises the same file-wide error
        with pytest.raises(ValueError, match=r"^GGUF file .*: 5 tensors of type IQ2_XXS"):
            use()
    with pytest.raises(ValueError, match=r"^GGUF file .*: 5 tensors of type IQ2_XXS"):  # so the loader refuses it
        load_pretrained(path)


def test_a_wrong_magic_is_named(valid, tmp_path, capsys):
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGUX" + valid.read_bytes()[4:])
    with pytest.raises(ValueError, match=rf"^{bad} is not a GGUF file: it starts with b'GGUX', not the magic bytes"):
        read_gguf(bad)
    assert_cli_one_line(bad, capsys, "not a GGUF file")


@pytest.mark.parametrize("version,version_bytes,message", [
    (1, None, "GGUF version 1 is not supported; scratchlm reads versions 2 and 3"),
    (4, None, "GGUF version 4 is not supported; scratchlm reads versions 2 and 3"),
    (3, struct.pack(">I", 3), "it is a big-endian GGUF file; scratchlm reads little-endian GGUF files only"),
])
def test_versions_other_than_2_and_3_are_refused(tmp_path, capsys, version, version_bytes, message):
    path = hand_gguf(tmp_path / "v.gguf", [kv("general.architecture", "llama")], version, version_bytes=version_bytes)
    with pytest.raises(ValueError, match=f"^GGUF file {path}: {message}"):
        read_gguf(path)
    assert_cli_one_line(path, capsys, message)


def test_version_2_reads(tmp_path):
    path = hand_gguf(tmp_path / "v2.gguf", [kv("general.architecture", "llama")], version=2)
    assert read_gguf(path).version == 2


def test_a_truncated_file_is_named(valid, tmp_path, capsys):
    raw = valid.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[:-100])  # the header is whole; output_norm.weight's 256 bytes are not
    message = (f"GGUF file {cut}: the file is truncated: tensor output_norm.weight (F32, shape (64,)) needs bytes "
               f"{len(raw) - 256} to {len(raw)} but the file ends at byte {len(raw) - 100}; "
               "download or convert it again")
    with pytest.raises(ValueError) as exc:
        read_gguf(cut)
    assert str(exc.value) == message
    assert_cli_one_line(cut, capsys, "the file is truncated: tensor output_norm.weight")
    head = tmp_path / "head.gguf"
    head.write_bytes(raw[:300])  # cut inside the metadata
    with pytest.raises(ValueError, match=rf"^GGUF file {head}: the file is truncated: it ends at byte 300, inside "
                                         r"[^;]+ \(at byte \d+, \d+ bytes\); download or convert it again$"):
        read_gguf(head)
    assert_cli_one_line(head, capsys, "the file is truncated: it ends at byte 300")


def test_tensor_data_past_the_end_of_the_file(valid, tmp_path, capsys):
    bad = patched(valid, tmp_path / "far.gguf", "token_embd.weight", "offset", 1 << 40)
    with pytest.raises(ValueError, match=rf"^GGUF file {bad}: tensor token_embd.weight's data starts at byte \d+, "
                                         r"past the end of the file \(\d+ bytes\); the file is truncated or its tensor "
                                         "directory is corrupt"):
        read_gguf(bad)
    assert_cli_one_line(bad, capsys, "past the end of the file")


def test_a_shape_that_does_not_match_the_type_or_the_data(valid, tmp_path, capsys):
    rows = patched(valid, tmp_path / "rows.gguf", "token_embd.weight", "ne0", 48)  # 48 values: 1.5 Q8_0 blocks
    with pytest.raises(ValueError, match=rf"^GGUF file {rows}: tensor token_embd.weight \(Q8_0, shape \(8, 48\)\) "
                                         r"has rows of 48 values, not a whole number of Q8_0 blocks \(32 values "
                                         r"each\): its shape does not match its type"):
        read_gguf(rows)
    assert_cli_one_line(rows, capsys, "not a whole number of Q8_0 blocks")
    big = patched(valid, tmp_path / "big.gguf", "token_embd.weight", "ne1", 10)  # more rows than its bytes hold
    with pytest.raises(ValueError, match=rf"^GGUF file {big}: tensor token_embd.weight's data \(its shape and type "
                                         r"make it end at byte \d+\) runs into tensor output_norm.weight's \(from "
                                         r"byte \d+\): a tensor's size does not match its shape and type"):
        read_gguf(big)
    assert_cli_one_line(big, capsys, "runs into tensor output_norm.weight's")


def test_an_unknown_type_id(valid, tmp_path, capsys):
    bad = patched(valid, tmp_path / "type.gguf", "output_norm.weight", "type", 99)
    contents = read_gguf(bad)  # the rest of the file is still readable
    t = contents.tensors["output_norm.weight"]
    assert (t.type_name, t.type_id, t.supported, t.raw) == (99, 99, False, None)
    assert contents.type_counts() == {"Q8_0": 1, 99: 1}
    message = f"GGUF file {bad}: tensor output_norm.weight of unknown ggml type id 99 is not supported by scratchlm"
    for use in (contents.check_tensor_types, t.dequantize, lambda: t.data):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}; supported types: F32, "):
            use()
    out = assert_cli_one_line(bad, capsys, "tensor output_norm.weight of unknown ggml type id 99")
    assert "  block types: Q8_0 1, type id 99 1 (not supported)" in out.splitlines()  # what the header says


@pytest.mark.parametrize("entries,message", [
    ([kv("general.architecture", "llama"), kv("llama.block_count", "thirty")],
     "metadata llama.block_count is a string ('thirty') but must be an integer"),
    ([kv("general.architecture", "llama"), kv("tokenizer.ggml.tokens", [1, 2, 3])],
     "metadata tokenizer.ggml.tokens is an array of int32 values ([1, 2, 3]) but must be an array of strings"),
    ([kv("general.architecture", 7)], "metadata general.architecture is a uint32 (7) but must be a string"),
    ([kv("general.architecture", "llama"), kv("llama.attention.layer_norm_rms_epsilon", "1e-5")],
     "metadata llama.attention.layer_norm_rms_epsilon is a string ('1e-5') but must be a number"),
    ([kv("general.architecture", "llama"), kv("tokenizer.ggml.model", ["gpt2"])],
     "metadata tokenizer.ggml.model is an array of strings (['gpt2']) but must be a string"),
])
def test_metadata_of_the_wrong_type(tmp_path, capsys, entries, message):
    path = hand_gguf(tmp_path / "meta.gguf", entries)
    with pytest.raises(ValueError) as exc:
        read_gguf(path)
    assert str(exc.value) == (f"GGUF file {path}: {message}; the file is corrupt or written by a broken converter, "
                              "download or convert it again")
    assert_cli_one_line(path, capsys, message)
