"""An internal failure inside the scheduler (here: the model raises once) answers 500 with OpenAI's error
JSON (or an error event in a stream), and the next request is served normally. The exception's text goes
to the server log, never to the client."""

from __future__ import annotations

import json

import torch
from fastapi.testclient import TestClient

from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.serve.server import create_app
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

BODY = {"model": "m", "prompt": "hi", "max_tokens": 3, "temperature": 0}


class FailOnce(TransformerLM):
    """A TransformerLM whose next forward raises when `armed`."""

    armed = False

    def forward(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            raise RuntimeError("boom")
        return super().forward(*args, **kwargs)


def test_internal_error_is_a_500_and_the_server_recovers(caplog):
    torch.manual_seed(0)
    model = FailOnce(get_preset("llama-tiny", vocab_size=259, d_model=32, n_layers=1, max_seq_len=32)).eval()
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    with TestClient(create_app(model, tok, "m")) as http:
        model.armed = True
        r = http.post("/v1/completions", json=BODY)
        err = r.json()["error"]
        assert r.status_code == 500 and err["type"] == "server_error" and err["code"] == "internal_error"
        assert "boom" not in err["message"] and "server log" in err["message"]

        model.armed = True
        lines = [ln for ln in http.post("/v1/completions", json={**BODY, "stream": True}).text.split("\n\n") if ln]
        err = json.loads(lines[0].removeprefix("data: "))["error"]
        assert err["code"] == "internal_error" and "boom" not in err["message"]
        assert json.loads(lines[1].removeprefix("data: "))["choices"][0]["finish_reason"] == "error"
        assert lines[-1] == "data: [DONE]"
        logged = [r for r in caplog.records if r.name == "scratchlm.serve" and r.exc_info]
        assert len(logged) == 2 and all("boom" in str(r.exc_info[1]) for r in logged)  # the details: in the log

        ok = http.post("/v1/completions", json=BODY)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        assert http.get("/health").json()["errors"] == 2
