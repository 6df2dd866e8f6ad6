"""LoRA SFT of the real model from its GGUF file, end to end: `scratchlm sft --lora-r` on chat data (the
model's own chat template) writes a PEFT adapter that transformers + peft apply to the same GGUF model
with the logits of our merged model, and `scratchlm eval` reads the adapter directory."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from scratchlm.cli.main import main
from scratchlm.load import load_pretrained

pytestmark = pytest.mark.slow


def test_lora_sft_adapter_loads_in_peft_with_our_logits(smollm2_gguf, hf_smollm2, tmp_path, capsys):
    from peft import PeftModel

    chats = [{"messages": [{"role": "user", "content": f"What is {a}+{a}?"},
                           {"role": "assistant", "content": f"{a}+{a}={2 * a}."}]} for a in range(4)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in chats))
    out = tmp_path / "lora"
    rc = main(["sft", "--checkpoint", str(smollm2_gguf), "--data", str(data), "--out", str(out), "--steps", "2",
               "--batch-size", "2", "--lr", "1e-2", "--lora-r", "4", "--lora-targets", "q_proj,v_proj,down_proj",
               "--threads", "1", "--checkpoint-every", "0"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["assistant_loss_end"] < summary["assistant_loss_start"]
    ours = load_pretrained(out).model.eval()  # base from the GGUF path in adapter_config + merged adapter
    hf, tok = hf_smollm2
    ids = torch.tensor([tok.apply_chat_template(chats[0]["messages"], tokenize=True, return_dict=False)])
    with torch.no_grad():
        want = ours(ids)
        peft = PeftModel.from_pretrained(copy.deepcopy(hf), out).eval()  # the session's model stays clean
        got = peft(ids).logits
        with peft.disable_adapter():
            base = peft(ids).logits
    assert (got - want).abs().max() < 1e-4  # 30 layers of fp32 in two implementations
    assert (got - base).abs().max() > 1e-3  # the adapter changed the model
