"""Bad input catalogue: each case answers 4xx with OpenAI's error JSON, and the server keeps serving.

After every case a valid request must still succeed (the `still_serving` fixture)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from serve_helpers import client
from tiny_checkpoint import CONTEXT, MAX_BODY, MODEL

GOOD_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GOOD_COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
LONG_TEXT = "the king " * CONTEXT  # far more than CONTEXT tokens

# (case id, path, JSON body, expected status, expected error param or None, expected error code or None)
CASES = [
    ("unknown-model", "/completions", {**GOOD_COMPLETION, "model": "gpt-9"}, 404, "model", "model_not_found"),
    ("missing-model", "/completions", {"prompt": "hi"}, 400, "model", None),
    ("missing-messages", "/chat/completions", {"model": MODEL}, 400, "messages", None),
    ("empty-messages", "/chat/completions", {**GOOD_CHAT, "messages": []}, 400, "messages", None),
    ("bad-role", "/chat/completions", {**GOOD_CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages.0.role", None),
    ("content-not-text", "/chat/completions", {**GOOD_CHAT, "messages": [{"role": "user", "content": 5}]}, 400,
     None, None),
    ("max-tokens-string", "/completions", {**GOOD_COMPLETION, "max_tokens": "10"}, 400, "max_tokens", None),
    ("max-tokens-float", "/completions", {**GOOD_COMPLETION, "max_tokens": 2.5}, 400, "max_tokens", None),
    ("temperature-string", "/chat/completions", {**GOOD_CHAT, "temperature": "hot"}, 400, "temperature", None),
    ("stream-not-bool", "/completions", {**GOOD_COMPLETION, "stream": "yes"}, 400, "stream", None),
    ("prompt-wrong-type", "/completions", {**GOOD_COMPLETION, "prompt": {"text": "hi"}}, 400, None, None),
    ("max-tokens-zero", "/completions", {**GOOD_COMPLETION, "max_tokens": 0}, 400, "max_tokens", None),
    ("max-tokens-negative", "/chat/completions", {**GOOD_CHAT, "max_tokens": -5}, 400, "max_tokens", None),
    ("max-tokens-beyond-context", "/completions", {**GOOD_COMPLETION, "max_tokens": CONTEXT + 1}, 400,
     "max_tokens", "context_length_exceeded"),
    ("chat-max-tokens-beyond-context", "/chat/completions", {**GOOD_CHAT, "max_tokens": CONTEXT}, 400,
     "max_tokens", "context_length_exceeded"),
    ("prompt-longer-than-context", "/completions", {**GOOD_COMPLETION, "prompt": LONG_TEXT}, 400, "prompt",
     "context_length_exceeded"),
    ("messages-longer-than-context", "/chat/completions",
     {**GOOD_CHAT, "messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": None}, 400, "messages",
     "context_length_exceeded"),
    ("token-id-outside-vocab", "/completions", {**GOOD_COMPLETION, "prompt": [1, 2, 10**6]}, 400, "prompt", None),
    ("temperature-too-high", "/completions", {**GOOD_COMPLETION, "temperature": 2.5}, 400, "temperature", None),
    ("top-p-zero", "/completions", {**GOOD_COMPLETION, "top_p": 0}, 400, "top_p", None),
    ("n-zero", "/completions", {**GOOD_COMPLETION, "n": 0}, 400, "n", None),
    ("n-too-large", "/completions", {**GOOD_COMPLETION, "n": 1000}, 400, "n", None),
    ("penalty-out-of-range", "/chat/completions", {**GOOD_CHAT, "presence_penalty": 3}, 400, "presence_penalty",
     None),
    ("too-many-stops", "/completions", {**GOOD_COMPLETION, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ("empty-stop", "/completions", {**GOOD_COMPLETION, "stop": ""}, 400, "stop", None),
    ("logprobs-too-many", "/completions", {**GOOD_COMPLETION, "logprobs": 21}, 400, "logprobs", None),
    ("top-logprobs-without-logprobs", "/chat/completions", {**GOOD_CHAT, "top_logprobs": 2}, 400, "top_logprobs",
     None),
    ("logit-bias-unsupported", "/completions", {**GOOD_COMPLETION, "logit_bias": {"5": 10}}, 400, "logit_bias",
     None),
    ("suffix-unsupported", "/completions", {**GOOD_COMPLETION, "suffix": "end"}, 400, "suffix", None),
    ("functions-unsupported", "/chat/completions", {**GOOD_CHAT, "functions": [{"name": "f"}]}, 400, "functions",
     None),
    ("unknown-field", "/chat/completions", {**GOOD_CHAT, "temprature": 0.5}, 400, "temprature", None),
    ("unknown-message-field", "/chat/completions",
     {**GOOD_CHAT, "messages": [{"role": "user", "content": "hi", "nme": "x"}]}, 400, "messages.0.nme", None),
    ("best-of-unsupported", "/completions", {**GOOD_COMPLETION, "best_of": 3}, 400, "best_of", None),
    ("repetition-penalty-zero", "/completions", {**GOOD_COMPLETION, "repetition_penalty": 0}, 400,
     "repetition_penalty", None),
    ("schema-outside-subset", "/chat/completions",
     {**GOOD_CHAT, "response_format": {"type": "json_schema", "json_schema": {
         "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a"}}}}}},
     400, "response_format.json_schema.schema", "unsupported_schema"),
    ("json-schema-missing", "/chat/completions", {**GOOD_CHAT, "response_format": {"type": "json_schema"}}, 400,
     "response_format.json_schema", None),
    ("response-format-unknown", "/chat/completions", {**GOOD_CHAT, "response_format": {"type": "yaml"}}, 400,
     "response_format.type", None),
    ("stop-with-json", "/chat/completions", {**GOOD_CHAT, "stop": "}", "response_format": {"type": "json_object"}},
     400, "stop", None),
    ("json-max-tokens-too-small", "/completions",
     {**GOOD_COMPLETION, "max_tokens": 1, "response_format": {"type": "json_object"}}, 400, "max_tokens", None),
    ("body-not-object", "/completions", [1, 2, 3], 400, None, None),
    ("too-many-choices", "/completions", {**GOOD_COMPLETION, "prompt": ["a"] * 5, "n": 16}, 400, "prompt", None),
]


def post(server, path: str, content: bytes | str, headers: dict | None = None) -> httpx.Response:
    h = {"Content-Type": "application/json", **server.headers(), **(headers or {})}
    return httpx.post(server.api + path, content=content, headers=h, timeout=30)


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
    return err


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    r = httpx.post(server.api + "/chat/completions", json=GOOD_CHAT, headers=server.headers(), timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("path,body,status,param,code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request(server, path, body, status, param, code):
    err = assert_openai_error(post(server, path, json.dumps(body)), status)
    if param is not None:
        assert err["param"] == param
    assert err["code"] == code


def test_prompt_too_long_names_the_limit(server):
    err = assert_openai_error(post(server, "/completions", json.dumps({**GOOD_COMPLETION, "prompt": LONG_TEXT})), 400)
    assert str(CONTEXT) in err["message"] and "shorten" in err["message"]


@pytest.mark.parametrize("raw", ["{bad json", "", "\xff\xfe", '{"model": "tiny",', "[" * 8000 + "]" * 8000],
                         ids=["garbage", "empty", "binary", "truncated", "nested-8000-deep"])
def test_malformed_json(server, raw):
    err = assert_openai_error(post(server, "/completions", raw.encode("latin-1")), 400)
    assert "JSON" in err["message"]


def test_oversize_body_with_length(server):
    body = json.dumps({**GOOD_COMPLETION, "prompt": "x" * (MAX_BODY + 10)})
    err = assert_openai_error(post(server, "/completions", body), 413)
    assert str(MAX_BODY) in err["message"]


def test_oversize_body_chunked(server):
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(MAX_BODY // 1000 + 2):
            yield b"x" * 1000
        yield b'"}'

    headers = {**server.headers(), "Content-Type": "application/json"}
    r = httpx.post(server.api + "/completions", content=chunks(), headers=headers, timeout=30)
    assert_openai_error(r, 413)


def test_unsupported_fields_are_named(server):
    body = {**GOOD_CHAT, "logit_bias": {"1": 2}, "functions": [], "temprature": 1}
    err = assert_openai_error(post(server, "/chat/completions", json.dumps(body)), 400)
    assert "'logit_bias'" in err["message"] and "'functions'" in err["message"]  # every one named, with why
    err = assert_openai_error(post(server, "/chat/completions", json.dumps({**GOOD_CHAT, "temprature": 1})), 400)
    assert "'temprature'" in err["message"] and "temperature" in err["message"]  # the fields it does take


@pytest.mark.parametrize("digits", [5000, 12_000])
def test_huge_integer_is_a_400_without_internals(server, digits):
    raw = '{"model": "tiny", "prompt": "hi", "max_tokens": ' + "7" * digits + "}"
    err = assert_openai_error(post(server, "/completions", raw), 400)
    message = err["message"].lower()
    assert "digits" in message and "exceeds the limit" not in message and "int_max_str_digits" not in message


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None,
                                          "multipart/form-data; boundary=x"])
def test_only_json_bodies(server, content_type):
    """A browser can send text/plain or form bodies cross-site without a CORS preflight: refuse them."""
    headers = {**server.headers(), **({"Content-Type": content_type} if content_type else {})}
    r = httpx.post(server.api + "/chat/completions", content=json.dumps(GOOD_CHAT), headers=headers, timeout=30)
    if content_type is None:  # httpx sends no Content-Type for raw bytes
        assert "content-type" not in r.request.headers
    assert assert_openai_error(r, 415)["code"] == "unsupported_media_type"


def test_host_allow_list_on_loopback(server):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example."""
    port = server.url.rsplit(":", 1)[1]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        r = httpx.get(server.api + "/models", headers={**server.headers(), "Host": host}, timeout=30)
        err = assert_openai_error(r, 400)
        assert err["code"] == "invalid_host" and "--allowed-hosts" in err["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"LOCALHOST:{port}"):
        r = httpx.get(server.api + "/models", headers={**server.headers(), "Host": host}, timeout=30)
        assert r.status_code == 200, host


def test_no_cors_by_default(server):
    origin = {"Origin": "http://evil.example"}
    pre = httpx.options(server.api + "/chat/completions", timeout=30, headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
    assert pre.status_code in (400, 405) and "access-control-allow-origin" not in pre.headers
    r = httpx.get(server.api + "/models", headers={**server.headers(), **origin}, timeout=30)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_missing_api_key(server):
    r = httpx.post(server.api + "/completions", json=GOOD_COMPLETION, timeout=30)
    assert assert_openai_error(r, 401)["code"] == "invalid_api_key"


def test_wrong_api_key(server):
    r = httpx.get(server.api + "/models", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert assert_openai_error(r, 401)["code"] == "invalid_api_key"


def test_openai_client_sees_typed_errors(server):
    bad_key = openai.OpenAI(base_url=server.api, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    with pytest.raises(openai.NotFoundError) as exc:
        client(server).completions.create(model="nope", prompt="hi", max_tokens=2)
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        client(server).completions.create(model=MODEL, prompt="hi", max_tokens=CONTEXT + 5)
    assert exc.value.code == "context_length_exceeded"


def test_unknown_route_and_method(server):
    assert_openai_error(httpx.get(server.api + "/engines", timeout=30), 404)
    assert_openai_error(httpx.get(server.api + "/completions", timeout=30), 405)
