"""`scratchlm convert --from-hf / --to-hf` end to end, tokenizer.json travelling with the model."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import build_hf, hf_logits, random_ids
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import scratchlm

from scratchlm.model_files import load_model, save_model
from scratchlm.cli.main import main
from scratchlm.config import get_preset
from scratchlm.interop.hf.tokenizer_copy import load_hf_tokenizer
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, train_bpe
from scratchlm.tokenizer import Tokenizer as ScratchTokenizer

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak. <|endoftext|> caf\u00e9 \U0001f600!"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, shared_data):
    """A Qwen2 HF directory with random weights and GPT-2's byte-level BPE tokenizer.json."""
    directory = tmp_path_factory.mktemp("hf")
    build_hf("qwen2").save_pretrained(directory)
    tok = Tokenizer(models.BPE.from_file(str(shared_data / "gpt2_vocab.json"), str(shared_data / "gpt2_merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    return directory


def test_convert_from_hf_then_back(hf_dir, tmp_path, capsys):
    ids = random_ids()
    expected = hf_logits(AutoModelForCausalLM.from_pretrained(hf_dir).eval(), ids)
    ours_dir, back_dir = tmp_path / "ours", tmp_path / "back"

    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(ours_dir)]) == 0
    assert "wrote" in capsys.readouterr().out
    with torch.no_grad():
        assert (load_model(ours_dir)(ids) - expected).abs().max().item() <= 1e-4
    assert (ours_dir / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()
    hf_tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    assert ScratchTokenizer.load(ours_dir).encode(TEXT) == hf_tok.encode(TEXT).ids  # the copied tokenizer.json

    assert main(["convert", "--to-hf", str(ours_dir), "--out", str(back_dir), "--max-shard-size", "40KB"]) == 0
    assert (back_dir / "model.safetensors.index.json").exists()
    assert torch.equal(hf_logits(AutoModelForCausalLM.from_pretrained(back_dir).eval(), ids), expected)
    assert (back_dir / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()


def test_convert_to_hf_bfloat16(hf_dir, tmp_path):
    ours_dir = tmp_path / "ours"
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(ours_dir)]) == 0
    assert main(["convert", "--to-hf", str(ours_dir), "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    reference = load_model(ours_dir)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(hf.state_dict()[name], tensor.to(torch.bfloat16)), name


def test_convert_errors_are_one_line(hf_dir, tmp_path, capsys):
    assert main(["convert", "--from-hf", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(hf_dir)]) == 2
    assert "already holds" in capsys.readouterr().err  # the output guard refuses first
    assert main(["convert", "--from-hf", str(hf_dir), "--out", str(hf_dir), "--overwrite"]) == 2
    assert "source directory" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not a model")
    assert main(["convert", "--to-hf", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "is a file but not a GGUF file" in capsys.readouterr().err


@pytest.fixture(scope="module")
def bpe_tok(shared_data, tmp_path_factory) -> ScratchTokenizer:
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text((shared_data / "tinyshakespeare.txt").read_text()[:40_000])
    return ScratchTokenizer(*train_bpe(corpus, 320, DEFAULT_SPECIAL_TOKENS), DEFAULT_SPECIAL_TOKENS)


def test_convert_to_hf_writes_scratchlm_tokenizer_as_tokenizer_json(bpe_tok, tmp_path):
    """A scratchlm checkpoint dir (model + trained BPE) -> HF dir that AutoTokenizer reads with equal ids."""
    tok = bpe_tok
    model = TransformerLM(get_preset("llama-tiny", vocab_size=tok.vocab_size, n_layers=1))
    save_model(model, tmp_path / "ckpt")
    tok.save(tmp_path / "ckpt")
    assert main(["convert", "--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok(TEXT)["input_ids"] == tok.encode(TEXT)
    assert hf_tok.decode(tok.encode(TEXT)) == TEXT


def test_save_pretrained_with_tokenizer_round_trips(bpe_tok, tmp_path):
    model = TransformerLM(get_preset("gpt2-tiny", vocab_size=bpe_tok.vocab_size, n_layers=1))
    eos = bpe_tok.special_token_ids["<|endoftext|>"]
    directory = scratchlm.save_pretrained(model, tmp_path, tokenizer=bpe_tok, eos_token_id=eos)
    back = load_hf_tokenizer(directory)
    assert back.vocab == bpe_tok.vocab and back.merges == bpe_tok.merges
    assert back.special_token_ids == bpe_tok.special_token_ids
    assert AutoTokenizer.from_pretrained(directory)(TEXT)["input_ids"] == bpe_tok.encode(TEXT)
    assert AutoConfig.from_pretrained(directory).eos_token_id == eos


def test_from_hf_with_unsupported_tokenizer_copies_it_and_says_why(tmp_path, capsys):
    """A tokenizer.json scratchlm cannot read (here: a WordLevel model) travels unchanged; the model converts."""
    from tokenizers import models as tok_models

    src = tmp_path / "hf"
    build_hf("llama_tied_gqa").save_pretrained(src)
    Tokenizer(tok_models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(src / "tokenizer.json"))
    assert main(["convert", "--from-hf", str(src), "--out", str(tmp_path / "ours")]) == 0
    assert "scratchlm cannot run this tokenizer" in capsys.readouterr().out
    assert (tmp_path / "ours" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    with pytest.raises(ValueError, match="model type 'WordLevel' is not supported"):
        ScratchTokenizer.load(tmp_path / "ours")
