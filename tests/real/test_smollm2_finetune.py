"""SFT -> DPO -> GRPO (LoRA, merged) on SmolLM2 straight from its GGUF, then export to HF: transformers loads the
result with the same logits, the same tokenizer and the model's own chat template."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scratchlm.cli.main import main
from scratchlm.load import from_pretrained

pytestmark = pytest.mark.slow
COMMON = ["--threads", "1", "--checkpoint-every", "0", "--lora-r", "4", "--merge", "--seed", "0"]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_sft_dpo_grpo_then_export_to_hf(tmp_path, smollm2_gguf, smollm2_model, capsys):
    chat = _jsonl(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
        {"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]}])
    prefs = _jsonl(tmp_path / "prefs.jsonl", [
        {"prompt": [{"role": "user", "content": "Capital of France?"}], "chosen": "Paris.", "rejected": "Rome."},
        {"prompt": [{"role": "user", "content": "2+3?"}], "chosen": "5", "rejected": "6"}])
    prompts = _jsonl(tmp_path / "prompts.jsonl", [
        {"prompt": [{"role": "user", "content": "Say yes."}], "reward": "contains", "answer": "yes"}])
    sft, dpo, grpo = (str(tmp_path / n) for n in ("sft", "dpo", "grpo"))
    assert main(["sft", "--checkpoint", str(smollm2_gguf), "--data", chat, "--out", sft, "--steps", "2",
                 "--batch-size", "2", "--lr", "1e-3", *COMMON]) == 0
    assert main(["dpo", "--checkpoint", sft, "--data", prefs, "--out", dpo, "--steps", "2", "--batch-size", "2",
                 "--lr", "1e-3", *COMMON]) == 0
    assert main(["grpo", "--checkpoint", dpo, "--data", prompts, "--out", grpo, "--steps", "1", "--group-size", "2",
                 "--prompts-per-step", "1", "--max-new-tokens", "6", "--lr", "1e-3", *COMMON]) == 0
    assert main(["convert", "--to-hf", grpo, "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    ours = from_pretrained(grpo)
    base = smollm2_model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(ours.state_dict()["model.layers.0.self_attn.q_proj.weight"], base)  # it trained
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert hf_tok.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    with torch.no_grad():
        x = torch.tensor([ids])
        assert (hf(x).logits - ours(x)).abs().max() <= 1e-3
