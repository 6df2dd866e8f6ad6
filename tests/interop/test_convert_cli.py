"""`scratchlm convert --from-hf / --to-hf` end to end, tokenizer.json travelling with the model."""

from __future__ import annotations

import pytest
import torch
from interop_helpers import build_hf, hf_logits, random_ids
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM

from scratchlm.checkpoint import load_model
from scratchlm.cli.main import main


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
    assert "source directory" in capsys.readouterr().err
    assert main(["convert", "--to-hf", str(hf_dir), "--out", str(tmp_path / "o")]) == 2
    assert "Hugging Face config" in capsys.readouterr().err
