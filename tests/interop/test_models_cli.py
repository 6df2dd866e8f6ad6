"""`scratchlm models FILE.gguf`: the model's line, then what the file holds (architecture, block types with their
counts, tokenizer kind); a file scratchlm cannot load still shows all that, marked, then one error line (exit 2)."""

from __future__ import annotations

from collections import Counter

import gguf
import pytest
from transformers import Qwen2Config, Qwen2ForCausalLM

from gguf_helpers import tokenizer_metadata, write_gguf
from interop_helpers import randomize_
from scratchlm.cli.main import main
from scratchlm.cli.model_info import gguf_description
from scratchlm.interop.gguf.reader import read_gguf
from test_gguf_bad_input import IQ2_XXS, writer_gguf


def block_types(path) -> str:
    """The "TYPE count, ..." line from gguf-py's own reader (most frequent first, ties in file order)."""
    counts = Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)
    return ", ".join(f"{name} {n}" for name, n in counts.most_common())


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory, hf_tokenizer):
    tok = hf_tokenizer
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = randomize_(Qwen2ForCausalLM(config)).eval()
    path = tmp_path_factory.mktemp("models_cli") / "tiny.gguf"
    types = {"model.layers.0.mlp.up_proj.weight": "Q4_0", "model.layers.1.mlp.down_proj.weight": "F16"}
    return write_gguf(hf, path, "qwen2", types=types, default_type="Q8_0",
                      metadata=tokenizer_metadata(tok, "qwen2", eos="<|im_end|>")), tok


def test_models_names_architecture_block_types_and_tokenizer(tiny_qwen2, capsys):
    path, tok = tiny_qwen2
    assert main(["models", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gguf tiny.gguf: qwen2, ")  # the loaded model's own line comes first
    assert lines[1:4] == [
        "  architecture: qwen2, 2 blocks, embedding 64, 4 heads, 2 kv heads, feed-forward 96, context 96",
        f"  block types: {block_types(path)}",
        f"  tokenizer: gpt2 (byte-level BPE), {tok.get_vocab_size()} tokens, pre-tokenizer 'qwen2'",
    ]
    assert lines[2] == "  block types: Q8_0 13, F32 11, Q4_0 1, F16 1"
    assert lines[4].startswith("  file: GGUF v3, 26 tensors, ") and len(lines) == 5


def test_an_unloadable_file_shows_what_it_holds_then_one_error(tiny_qwen2, tmp_path, capsys):
    bad = writer_gguf(tmp_path / "odd.gguf", arch="rwkv7", weight_type=IQ2_XXS, n_weights=3, tokenizer_model="rwkv")
    assert main(["models", str(tiny_qwen2[0]), str(bad)]) == 2  # the good file first, then the bad one
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("gguf tiny.gguf: qwen2, ") and len(lines) == 10
    assert lines[5:] == [
        "gguf odd.gguf: rwkv7 'Tiny', not loadable by scratchlm",
        "  architecture: rwkv7, 1 block, embedding 64, 4 heads, feed-forward 96, context 32 (not supported)",
        "  block types: IQ2_XXS 3 (not supported), F32 1",
        "  tokenizer: rwkv (RWKV), 4 tokens, pre-tokenizer 'qwen2' (not supported)",
        f"  file: GGUF v3, 4 tensors, 14 metadata keys, {bad.stat().st_size} bytes",
    ]
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"scratchlm models: error: {bad} cannot be loaded by scratchlm: ")
    problems = ["general.architecture='rwkv7' is not supported",  # every problem, in one line
                "3 tensors of type IQ2_XXS (token_embd.weight, blk.0.attn_q.weight, blk.0.attn_k.weight) are not "
                "supported by scratchlm; supported types: F32, F16, ",
                "tokenizer.ggml.model='rwkv' is not supported"]
    assert all(p in err for p in problems), err
    assert err.index(problems[0]) < err.index(problems[1]) < err.index(problems[2])


def test_sentencepiece_vocabulary_is_named(tmp_path):
    path = writer_gguf(tmp_path / "sp.gguf", tokenizer_model="llama")
    line = gguf_description(read_gguf(path), {})[2]
    assert line == "  tokenizer: llama (SentencePiece-style), 4 tokens, pre-tokenizer 'qwen2'"


def test_the_real_fixture_is_described_from_its_header(smollm2_gguf):
    contents = read_gguf(smollm2_gguf)
    assert gguf_description(contents, {})[:3] == [
        "  architecture: llama, 30 blocks, embedding 576, 9 heads, 3 kv heads, feed-forward 1536, context 8192",
        "  block types: Q4_1 210, F32 61, Q8_0 1",
        "  tokenizer: gpt2 (byte-level BPE), 49152 tokens, pre-tokenizer 'smollm'",
    ]
    contents.check_tensor_types()  # every type is one scratchlm reads
    # nothing was read into memory: every tensor is a view of the (private, copy-on-write) mapped file
    assert all(not t.raw.flags.owndata for t in contents.tensors.values())
    assert sum(t.raw.nbytes for t in contents.tensors.values()) > 0.9 * smollm2_gguf.stat().st_size
