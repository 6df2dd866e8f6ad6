"""GGUF export: files transformers' GGUF loader (llama.cpp's conventions) and ours read back as the same model."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gguf_helpers import TEXTS, tiny_hf_model
from scratchlm.interop.gguf.model_load import load_gguf
from scratchlm.interop.gguf.writer import save_gguf
from scratchlm.load import from_pretrained
from scratchlm.tokenizer.pipeline import Tokenizer as OurTokenizer

@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_f32_export_reads_back_in_transformers_and_scratchlm(tmp_path, hf_tokenizer, family):
    hf = tiny_hf_model(family, hf_tokenizer.get_vocab_size())
    hf.save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    tok = OurTokenizer.from_hf_dict(json.loads(hf_tokenizer.to_str()))
    template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    path = save_gguf(ours, tmp_path / "m.gguf", type_name="F32", tokenizer=tok, chat_template=template,
                     stop_token_ids=[tok.token_to_id("<|im_end|>")])
    ids = torch.tensor([hf_tokenizer.encode("ROMEO: to be or not to be, that is").ids])
    with torch.no_grad():
        want = hf(ids).logits
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32).eval()
        assert (theirs(ids).logits - want).abs().max() <= 1e-4
        back = load_gguf(path, dtype=torch.float32)
        assert (back(ids) - want).abs().max() <= 1e-4
    for name, p in back.state_dict().items():
        assert torch.equal(p, ours.state_dict()[name]), name
    hf_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    for text in TEXTS:
        assert hf_tok.encode(text, add_special_tokens=False) == hf_tokenizer.encode(text).ids, text
    assert hf_tok.chat_template == template and hf_tok.eos_token == "<|im_end|>"


def test_q8_0_export_is_what_transformers_reads(tmp_path, hf_tokenizer):
    hf = tiny_hf_model("llama", hf_tokenizer.get_vocab_size())
    hf.save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    save_gguf(ours, tmp_path / "q.gguf", type_name="Q8_0")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="q.gguf", dtype=torch.float32).eval()
    back = load_gguf(tmp_path / "q.gguf", dtype=torch.float32)
    assert back.quantized_weights["model.layers.0.mlp.down_proj.weight"].ggml_type == "Q8_0"
    their_state = theirs.state_dict()
    for name, p in back.state_dict().items():
        assert torch.equal(p, their_state[name]), name
    # Q8_0 keeps each weight within half a quantization step of the original (plus the f16 scale's rounding)
    w, q = ours.state_dict()["model.layers.1.self_attn.q_proj.weight"], back.state_dict()["model.layers.1.self_attn.q_proj.weight"]
    step = w.reshape(-1, 32).abs().amax(1, keepdim=True) / 127
    assert ((q - w).reshape(-1, 32).abs() <= step * (0.5 + 127 * 2.0 ** -11)).all()


def test_export_refusals(tmp_path):
    from scratchlm.config import get_preset
    from scratchlm.model import TransformerLM

    with pytest.raises(ValueError, match="Q4_K"):
        save_gguf(TransformerLM(get_preset("llama-tiny", n_layers=1)), tmp_path / "a.gguf", type_name="Q4_K")
    with pytest.raises(ValueError, match="GGUF export supports the llama, qwen2, qwen3"):
        save_gguf(TransformerLM(get_preset("gpt2-tiny", n_layers=1)), tmp_path / "b.gguf")
    # llama.cpp runs full attention on every architecture without windows of its own: refused as each of them
    config = get_preset("llama-tiny", n_layers=1, qkv_bias=True, sliding_window=4)
    with pytest.raises(ValueError, match="qwen2: sliding_window=4 .*; llama: sliding_window=4 "):
        save_gguf(TransformerLM(config), tmp_path / "c.gguf")
    assert not list(tmp_path.iterdir())


def test_convert_cli_to_gguf_and_back(tmp_path, hf_tokenizer, capsys):
    from scratchlm.cli.main import main

    hf = tiny_hf_model("qwen2", hf_tokenizer.get_vocab_size())
    hf.save_pretrained(tmp_path / "hf")
    hf_tokenizer.save(str(tmp_path / "hf" / "tokenizer.json"))
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": "{{ 'x' }}"}))
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    gguf_path = tmp_path / "g" / "m.gguf"
    gguf_path.parent.mkdir()
    assert main(["convert", "--to-gguf", str(tmp_path / "ours"), "--out", str(gguf_path), "--type", "q8_0"]) == 0
    assert main(["convert", "--to-gguf", str(tmp_path / "ours"), "--out", str(gguf_path)]) == 2
    assert "already holds a file" in capsys.readouterr().err
    assert main(["convert", "--to-gguf", str(tmp_path / "ours"), "--out", str(gguf_path), "--type", "f32",
                 "--overwrite"]) == 0
    # GGUF -> HF dir: transformers loads it (model and tokenizer with the chat template) as the GGUF
    assert main(["convert", "--to-hf", str(gguf_path), "--out", str(tmp_path / "hf2")]) == 0
    assert main(["convert", "--from-hf", str(gguf_path), "--out", str(tmp_path / "ours2")]) == 0
    ids = torch.tensor([hf_tokenizer.encode("To be, or not to be").ids])
    with torch.no_grad():
        want = hf(ids).logits
        back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf2", dtype=torch.float32).eval()
        assert (back(ids).logits - want).abs().max() <= 1e-4
        assert (from_pretrained(tmp_path / "ours2")(ids) - want).abs().max() <= 1e-4
    tok2 = AutoTokenizer.from_pretrained(tmp_path / "hf2")
    assert tok2.encode(TEXTS[0], add_special_tokens=False) == hf_tokenizer.encode(TEXTS[0]).ids
    assert tok2.chat_template == "{{ 'x' }}" and tok2.eos_token == "<|im_end|>"
