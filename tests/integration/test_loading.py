"""One way to name a model: load_pretrained and every --checkpoint on scratchlm dirs, HF dirs and GGUF files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scratchlm.cli.main import main
from scratchlm.interop.hf.tokenizer_copy import save_hf_tokenizer
from scratchlm.load import load_pretrained, model_kind
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, shared_data: Path) -> tuple[Path, LlamaForCausalLM, Tokenizer]:
    """An HF Llama dir with random weights, a byte-level BPE tokenizer.json, a chat template and generation_config."""
    root = tmp_path_factory.mktemp("hf_model")
    corpus = root / "corpus.txt"
    corpus.write_text((shared_data / "tinyshakespeare.txt").read_text()[:20_000])
    tok = Tokenizer(*train_bpe(corpus, 300, DEFAULT_SPECIAL_TOKENS), DEFAULT_SPECIAL_TOKENS)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = LlamaForCausalLM(config).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else None
    d = root / "hf"
    hf.save_pretrained(d)
    save_hf_tokenizer(tok, d)
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                         "eos_token": "<|im_end|>", "chat_template": TEMPLATE}))
    stops = [tok.special_token_ids["<|im_end|>"], tok.special_token_ids["<|endoftext|>"]]
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": stops, "do_sample": True,
                                                          "temperature": 0.7, "top_p": 0.9}))
    return d, hf, tok


def test_hf_dir_loads_with_template_stops_and_sampling(hf_dir):
    d, hf, tok = hf_dir
    loaded = load_pretrained(d)
    assert loaded.kind == "hf" and loaded.family == "llama"
    ids = torch.tensor([tok.encode("ROMEO: to be or not")])
    with torch.no_grad():
        assert (loaded.model(ids) - hf(ids).logits).abs().max() <= 1e-4
    assert loaded.tokenizer.encode("hello there") == tok.encode("hello there")
    assert loaded.chat_template == TEMPLATE
    assert loaded.stop_token_ids == [tok.special_token_ids["<|im_end|>"], tok.special_token_ids["<|endoftext|>"]]
    assert loaded.sampling == {"temperature": 0.7, "top_p": 0.9}
    line = loaded.summary()
    assert line.startswith("hf hf: llama, ") and "context 128" in line and "the model's own" in line


def test_generate_cli_on_an_hf_dir_matches_transformers(hf_dir, capsys):
    d, hf, tok = hf_dir
    prompt = tok.encode("ROMEO:")
    stops = [tok.special_token_ids["<|im_end|>"], tok.special_token_ids["<|endoftext|>"]]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=stops,
                          pad_token_id=0)[0, len(prompt):].tolist()
    want = tok.decode(out[:-1] if out[-1] in stops else out)
    assert main(["generate", "--checkpoint", str(d), "--prompt", "ROMEO:", "--max-new-tokens", "20",
                 "--attn", "reference", "--decode", "model"]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_converted_dir_keeps_the_template_and_models_line(hf_dir, tmp_path, capsys):
    d, _, _ = hf_dir
    assert main(["convert", "--from-hf", str(d), "--out", str(tmp_path / "ours")]) == 0
    loaded = load_pretrained(tmp_path / "ours")
    assert loaded.kind == "scratchlm" and loaded.chat_template == TEMPLATE
    capsys.readouterr()
    assert main(["models", str(d), str(tmp_path / "ours")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("hf hf: llama") and lines[1].startswith("scratchlm ours: scratchlm")


def test_bad_model_paths_are_clear_errors(hf_dir, tmp_path, capsys):
    d, _, _ = hf_dir
    with pytest.raises(FileNotFoundError, match="does not exist"):
        model_kind(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="is a file but not a GGUF file"):
        model_kind(tmp_path / "notes.txt")
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(ValueError, match="holds 2 GGUF files"):
        model_kind(two)
    bare = tmp_path / "bare"
    shutil.copytree(d, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    assert main(["generate", "--checkpoint", str(bare), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "holds no tokenizer" in err and "--tokenizer DIR" in err and "Traceback" not in err
    assert main(["generate", "--checkpoint", str(bare), "--tokenizer", str(d), "--prompt", "hi",
                 "--max-new-tokens", "2"]) == 0
