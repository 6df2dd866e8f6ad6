"""`scratchlm chat` and `scratchlm serve` straight on the SmolLM2 GGUF, with the model's own chat template."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from scratchlm.cli.main import main

pytestmark = pytest.mark.slow
QUESTION = "What is the capital of France?"


def test_chat_answers_paris(smollm2_gguf, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(QUESTION + "\n"))
    assert main(["chat", "--checkpoint", str(smollm2_gguf), "--max-new-tokens", "24"]) == 0
    reply = capsys.readouterr().out
    assert "Paris" in reply, reply


def test_serve_answers_paris_through_openai_with_the_models_template(smollm2_gguf, hf_smollm2, tmp_path):
    from openai import OpenAI

    _, hf_tok = hf_smollm2
    messages = [{"role": "user", "content": QUESTION}]
    want_prompt = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "scratchlm.cli.main", "serve", "--checkpoint", str(smollm2_gguf),
                             "--port", "0", "--threads", "1", "--max-batch", "4", "--max-context", "2048"], stdout=subprocess.PIPE, stderr=log, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        line = proc.stdout.readline()
        assert "serving 'SmolLM2-135M-Instruct.Q4_1'" in line, (line, (tmp_path / "server.log").read_text())
        url = line.split(" on ", 1)[1].split()[0]
        client = OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)
        out = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=messages, max_tokens=24,
                                             temperature=0)
        assert "Paris" in out.choices[0].message.content, out
        assert out.usage.prompt_tokens == len(want_prompt)  # the model's template (with its default system prompt)
        assert out.choices[0].finish_reason == "stop"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
