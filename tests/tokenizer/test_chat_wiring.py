"""A checkpoint that ships its own chat template (here Llama-3.1's) is chatted with and fine-tuned in that
format: `scratchlm chat` equals transformers' greedy argmax on apply_chat_template, and the SFT / DPO / GRPO
data paths produce transformers' ids with the template's end-of-turn token."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from scratchlm.cli.main import main
from scratchlm.data.align_data import encode_chat, encode_preferences, encode_prompt, end_token, PreferencePair
from scratchlm.load import load_pretrained

from . import hf_styles

TEMPLATE = Path(__file__).parent / "chat_templates" / "llama3_1.jinja"
CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who is Romeo?"},
        {"role": "assistant", "content": "A lover in Verona."}, {"role": "user", "content": "And Juliet?"},
        {"role": "assistant", "content": "His love."}]


@pytest.fixture(scope="module")
def model_dir(shared_data, tmp_path_factory):
    """A tiny random Llama with a Llama-3-style tokenizer and the Llama-3.1 chat template, saved by transformers."""
    root = tmp_path_factory.mktemp("llama3chat")
    fast = PreTrainedTokenizerFast(tokenizer_object=hf_styles.build("llama3", shared_data, root), bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>", chat_template=TEMPLATE.read_text())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=fast.eos_token_id, bos_token_id=fast.bos_token_id)
    hf = LlamaForCausalLM(config).eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, std=0.3) if p.dim() > 1 else None
    hf.save_pretrained(root / "model")
    fast.save_pretrained(root / "model")
    return root / "model", hf


def test_sft_dpo_grpo_data_use_the_models_template(model_dir):
    directory, _ = model_dir
    hf = AutoTokenizer.from_pretrained(directory)
    tok = load_pretrained(directory).tokenizer
    assert tok.chat_template is not None
    (ids, mask), = encode_chat(tok, [CHAT])
    assert ids == hf.apply_chat_template(CHAT)["input_ids"]
    eot = hf.convert_tokens_to_ids("<|eot_id|>")
    assert [i for i, m in zip(ids, mask) if m][-1] == eot and sum(mask) == len(
        tok.encode("A lover in Verona.<|eot_id|>")) + len(tok.encode("His love.<|eot_id|>"))
    prompt = CHAT[:2]
    (p, chosen, rejected), = encode_preferences(tok, [PreferencePair(prompt, "Yes.", "No!")])
    assert p == hf.apply_chat_template(prompt, add_generation_prompt=True)["input_ids"] == encode_prompt(tok, prompt)
    assert chosen[-1] == rejected[-1] == end_token(tok, prompt) == eot
    assert encode_prompt(tok, "Once upon") == hf("Once upon")["input_ids"]  # raw prompts get BOS, like HF
    assert end_token(tok, "Once upon") == hf.eos_token_id


def test_chat_cli_replies_as_transformers_greedy(model_dir, capsys, monkeypatch):
    directory, hf_model = model_dir
    hf = AutoTokenizer.from_pretrained(directory)
    messages = [{"role": "user", "content": "Hello there"}]
    prompt = hf.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    out = []
    with torch.no_grad():  # greedy, one full forward per token (HF's own argmax, no cache involved)
        while len(out) < 12 and (not out or out[-1] != hf.eos_token_id):
            out.append(int(hf_model(torch.tensor([prompt + out])).logits[0, -1].argmax()))
    want = hf.decode(out[:-1] if out[-1] == hf.eos_token_id else out)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there\n/exit\n"))
    assert main(["chat", "--checkpoint", str(directory), "--max-new-tokens", "12", "--attn", "reference",
                 "--decode", "model"]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_sft_output_keeps_the_template(model_dir, tmp_path):
    directory, _ = model_dir
    data = tmp_path / "chat.jsonl"
    data.write_text(__import__("json").dumps({"messages": CHAT}) + "\n")
    out = tmp_path / "sft"
    assert main(["sft", "--checkpoint", str(directory), "--data", str(data), "--out", str(out), "--steps", "1",
                 "--batch-size", "1"]) == 0
    before, after = load_pretrained(directory).tokenizer, load_pretrained(out).tokenizer
    assert after.chat_template.render(CHAT) == before.chat_template.render(CHAT)
    assert encode_chat(after, [CHAT]) == encode_chat(before, [CHAT])
