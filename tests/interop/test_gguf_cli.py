"""A tiny GGUF file (model + tokenizer metadata) through load_pretrained and the CLI's --checkpoint."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from gguf_helpers import tokenizer_metadata, write_gguf
from interop_helpers import randomize_
from scratchlm.cli.main import main
from scratchlm.load import load_pretrained, model_kind

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, hf_tokenizer):
    tok = hf_tokenizer
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = randomize_(Qwen2ForCausalLM(config)).eval()
    d = tmp_path_factory.mktemp("tiny_gguf")
    meta = tokenizer_metadata(tok, "qwen2", chat_template=TEMPLATE, eos="<|im_end|>")
    meta["tokenizer.ggml.eot_token_id"] = tok.token_to_id("<|endoftext|>")
    return write_gguf(hf, d / "tiny.Q8_0.gguf", "qwen2", default_type="Q8_0", metadata=meta), hf, tok


def test_load_pretrained_gguf_brings_tokenizer_template_and_stops(tiny_gguf):
    path, _, tok = tiny_gguf
    loaded = load_pretrained(path, attn_impl="sdpa")
    assert loaded.kind == "gguf" and loaded.model.config.attn_impl == "sdpa"
    assert loaded.chat_template == TEMPLATE
    assert loaded.stop_token_ids == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    for text in ("To be, or not to be: 2024!", "<|im_start|>user\nhi<|im_end|>\n"):
        assert loaded.tokenizer.encode(text) == tok.encode(text).ids
    assert loaded.model.model.layers[1].mlp.up_proj.ggml_type == "Q8_0"  # the file's own blocks (dtype=None)
    dense = load_pretrained(path, dtype=torch.float32)
    assert dense.model.quantized_weights["model.layers.1.mlp.up_proj.weight"].ggml_type == "Q8_0"
    assert model_kind(path.parent) == ("gguf", path)  # a directory holding one GGUF names it
    line = loaded.summary()
    assert line.startswith("gguf tiny.Q8_0.gguf: qwen2, ") and "Q8_0" in line and "the model's own" in line


def test_generate_and_models_cli_on_a_gguf_match_transformers(tiny_gguf, capsys):
    path, _, tok = tiny_gguf
    prompt = tok.encode("ROMEO:").ids
    stops = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        out = theirs.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=stops,
                              pad_token_id=0)[0, len(prompt):].tolist()
    want = tok.decode(out[:-1] if out[-1] in stops else out, skip_special_tokens=False)
    assert main(["generate", "--checkpoint", str(path), "--prompt", "ROMEO:", "--max-new-tokens", "16",
                 "--decode", "model", "--attn", "reference"]) == 0
    assert capsys.readouterr().out == want + "\n"
    assert main(["models", str(path.parent)]) == 0
    assert capsys.readouterr().out.startswith("gguf tiny.Q8_0.gguf: qwen2")
    assert main(["info", "--checkpoint", str(path), "--seq-len", "8", "--batch-size", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{"):])
    assert report["checkpoint"] == str(path) and report["params"] == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("dtype,torch_dtype,rel", [("fp32", torch.float32, 1e-5), ("bf16", torch.bfloat16, 2e-2)])
def test_eval_dtype_dequantizes_to_it_and_matches_transformers(tiny_gguf, tmp_path, capsys, dtype, torch_dtype, rel):
    """--dtype fp32|bf16: a GGUF's blocks are dequantized to that dtype (transformers' dequantized weights cast
    to it, bit for bit), and eval's perplexity is transformers' at that dtype."""
    path, _, tok = tiny_gguf
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    theirs = theirs.to(torch_dtype)
    ours = load_pretrained(path, dtype=torch_dtype).model
    their_state = theirs.state_dict()
    for name, p in ours.state_dict().items():
        assert p.dtype == torch_dtype and torch.equal(p, their_state[name]), name
    text = "ROMEO: What say you, my lord? JULIET: Nothing, sir."
    ids = torch.tensor([tok.encode(text).ids])
    with torch.no_grad():
        logp = torch.log_softmax(theirs(ids).logits[0, :-1].float(), -1)
    nll = -logp.gather(-1, ids[0, 1:, None]).mean().item()
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": text}) + "\n")
    assert main(["eval", "--checkpoint", str(path), "--task", "perplexity", "--data", str(tmp_path / "t.jsonl"),
                 "--dtype", dtype, "--no-progress", "--device", "cpu"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["tokens"] == ids.shape[1] - 1
    assert got["perplexity"] == pytest.approx(math.exp(nll), rel=rel)
