"""The real-model fixture (SmolLM2-135M-Instruct, Q4_1 GGUF) served by `scratchlm serve` as a user runs it, through
the official openai client: the prompt is the model's own chat template rendered as transformers renders it
(HF's tokenizer built from the same GGUF is the reference), the greedy answer names Paris, structured output
holds on a 49152-token vocabulary with multi-byte tokens, and its template (which has no tools) refuses tools."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import jsonschema
import openai
import pytest

from serve_helpers import wait_for_url

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CITY = {"type": "object", "properties": {"name": {"type": "string"}, "population": {"type": "integer"},
                                         "rivers": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "population"], "additionalProperties": False}


@pytest.fixture(scope="module")
def smol_server(smollm2_gguf, tmp_path_factory):
    log = open(tmp_path_factory.mktemp("smol") / "server.log", "w")
    cmd = [sys.executable, "-m", "scratchlm.cli.main", "serve", "--checkpoint", str(smollm2_gguf), "--port", "0",
           "--threads", "1", "--model-name", "smol", "--max-batch", "4", "--max-context", "1024"]  # KV: 180 MiB, not 11 GiB
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        yield wait_for_url(process, 300)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.mark.slow
def test_smollm2_chat_template_structured_output_and_no_tools(smol_server, smollm2_gguf):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    c = openai.OpenAI(base_url=smol_server + "/v1", api_key="none", max_retries=0, timeout=120)
    expected = list(hf.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)["input_ids"])
    ours = httpx.post(smol_server + "/tokenize", json={"messages": QUESTION}, timeout=60).json()["tokens"]
    assert ours == expected
    out = c.chat.completions.create(model="smol", messages=QUESTION, max_tokens=12, temperature=0)
    assert out.usage.prompt_tokens == len(expected)
    assert "Paris" in out.choices[0].message.content and out.choices[0].finish_reason == "stop"

    ask = [{"role": "user", "content": "Describe Paris as JSON with its name, population and rivers."}]
    js = c.chat.completions.create(model="smol", messages=ask, max_tokens=120, temperature=0.7, seed=1, n=2,
                                   response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}})
    for choice in js.choices:
        jsonschema.validate(json.loads(choice.message.content), CITY)

    with pytest.raises(openai.BadRequestError, match="does not render tools"):
        c.chat.completions.create(model="smol", messages=QUESTION, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
