"""Operations: the bounded queue (429 + Retry-After), Prometheus /metrics, the access log, tokenizing off the
event loop after a size check, CORS only when asked for, the API key from the environment, the warnings
printed before serving, and clients that go away (their rows freed). Servers run in-process
(inprocess.py) on models the test controls."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from scratchlm.cli.serve import resolve_api_key
from scratchlm.generate import generate
from scratchlm.serve.launch import default_allowed_hosts, security_warnings
from scratchlm.serve.server import create_app
from scratchlm.tokenizer import Tokenizer

from inprocess import byte_model, get_json, serve_in_thread, wait_until

BODY = {"model": "m", "prompt": "hi", "max_tokens": 4, "temperature": 0}


def metric_values(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_full_queue_is_429_with_retry_after_then_metrics_and_access_log(caplog):
    caplog.set_level(logging.INFO, logger="scratchlm.serve.access")
    model, tok = byte_model()
    with serve_in_thread(create_app(model, tok, "m", max_batch=1, max_queue=2)) as (url, _):
        model.armed = True
        with ThreadPoolExecutor(3) as pool:
            post = lambda: httpx.post(url + "/v1/completions", json=BODY, timeout=60)  # noqa: E731
            first = pool.submit(post)
            wait_until(model.entered.is_set)  # request 1 is in its prefill: it holds the only batch row
            queued = [pool.submit(post) for _ in range(2)]
            wait_until(lambda: get_json(url + "/health")["waiting"] == 2)
            busy_client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.RateLimitError) as busy:  # the official client's type for a 429
                busy_client.completions.create(**BODY)
            assert busy.value.response.headers["retry-after"] == "1" and busy.value.code == "queue_full"
            model.armed = False
            model.gate.set()
            done = [f.result() for f in [first, *queued]]
        assert [r.status_code for r in done] == [200, 200, 200]
        completion = sum(r.json()["usage"]["completion_tokens"] for r in done)
        m = metric_values(url)
    posts = (("endpoint", "/v1/completions"),)
    assert m[("scratchlm_requests_total", tuple(sorted(posts + (("status", "200"),))))] == 3
    assert m[("scratchlm_requests_total", tuple(sorted(posts + (("status", "429"),))))] == 1
    assert m[("scratchlm_generated_tokens_total", ())] == completion == 12
    assert m[("scratchlm_prompt_tokens_total", ())] == 3 * len(tok.encode("hi"))
    assert m[("scratchlm_time_to_first_token_seconds_count", ())] == 3
    assert m[("scratchlm_request_latency_seconds_count", ())] == 4
    assert m[("scratchlm_queue_depth", ())] == 0 and m[("scratchlm_running_rows", ())] == 0
    assert m[("scratchlm_tokens_per_second", ())] > 0
    lines = [r.getMessage() for r in caplog.records if r.name == "scratchlm.serve.access"]
    posted = [ln for ln in lines if '"POST /v1/completions"' in ln]
    assert len(posted) == 4 and sum(" 429 " in ln for ln in posted) == 1
    assert sum(" 200 " in ln and "completion=4" in ln and "ttft=" in ln for ln in posted) == 3


class SpyTokenizer(Tokenizer):
    """Records the thread of every encode call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.threads: list[str] = []

    def encode(self, text: str) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text)

    def encode_ordinary(self, text: str) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode_ordinary(text)


def test_tokenizing_runs_off_the_event_loop_after_a_size_check():
    model, byte_tok = byte_model()
    tok = SpyTokenizer(byte_tok.vocab, byte_tok.merges, byte_tok.special_tokens)
    with TestClient(create_app(model, tok, "m", max_body_bytes=2 << 20)) as http:
        huge = http.post("/v1/completions", json={**BODY, "prompt": "x" * 1_000_000})
        assert huge.status_code == 400 and huge.json()["error"]["code"] == "context_length_exceeded"
        assert "at least" in huge.json()["error"]["message"]
        chat = {"model": "m", "messages": [{"role": "user", "content": "y" * 500_000}]}
        assert http.post("/v1/chat/completions", json=chat).status_code == 400
        assert tok.threads == []  # refused before any tokenizing
        ok = http.post("/v1/completions", json=BODY)
        ok_chat = http.post("/v1/chat/completions", json={**chat, "messages": [{"role": "user", "content": "y"}],
                                                          "max_tokens": 2})
        assert ok.status_code == 200 and ok_chat.status_code == 200
    assert tok.threads and all(name.startswith("scratchlm-tokenize") for name in tok.threads)


def test_cors_only_for_allowed_origins():
    model, tok = byte_model()
    with TestClient(create_app(model, tok, "m", allowed_origins=["http://app.example"])) as http:
        pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        ok = http.options("/v1/completions", headers={"Origin": "http://app.example", **pre})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"
        bad = http.options("/v1/completions", headers={"Origin": "http://evil.example", **pre})
        assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
        r = http.post("/v1/completions", json=BODY, headers={"Origin": "http://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"


def test_host_allow_list_names_the_flag():
    model, tok = byte_model()
    with TestClient(create_app(model, tok, "m", allowed_hosts=["api.example"])) as http:
        assert http.get("/health", headers={"Host": "api.example:8000"}).status_code == 200
        r = http.get("/health", headers={"Host": "other.example"})
        assert r.status_code == 400 and "--allowed-hosts other.example" in json.dumps(r.json())


def test_api_key_from_environment_and_warnings():
    assert resolve_api_key(None, {"SCRATCHLM_API_KEY": "k1"}) == "k1"
    assert resolve_api_key("k2", {"SCRATCHLM_API_KEY": "k1"}) == "k2"  # the flag wins
    assert resolve_api_key(None, {"SCRATCHLM_API_KEY": ""}) is None and resolve_api_key(None, {}) is None
    warned = security_warnings("0.0.0.0", None)
    assert len(warned) == 1 and "without an API key" in warned[0] and "SCRATCHLM_API_KEY" in warned[0]
    assert security_warnings("0.0.0.0", "k") == [] and security_warnings("127.0.0.1", None) == []
    assert default_allowed_hosts("127.0.0.1", None) == ["localhost", "127.0.0.1", "[::1]"]
    assert default_allowed_hosts("0.0.0.0", None) is None and default_allowed_hosts("0.0.0.0", ["a"]) == ["a"]


def slow_server_setup():
    """A model slowed to 20 ms per forward, and a greedy prompt whose first 40 tokens hold no stop token (so a
    request for 100 of them certainly outlives the client)."""
    model, tok = byte_model(max_seq_len=160, delay=0.02)
    stops = set(tok.special_token_ids.values())
    prompt = next(p for p in ("abc", "hello", "xyz", "0123") if not stops & set(
        generate(model, [tok.encode(p)], 40)[0]))
    return model, tok, {"model": "m", "prompt": prompt, "max_tokens": 100, "temperature": 0, "n": 4}


def test_client_gone_mid_stream_or_before_the_answer_cancels_and_frees_rows():
    model, tok, body = slow_server_setup()
    with serve_in_thread(create_app(model, tok, "m", max_batch=8)) as (url, _):
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=30) as r:
            assert r.status_code == 200
            assert next(r.iter_lines()).startswith("data: {")  # one token arrived; then the client goes away
        wait_until(lambda: get_json(url + "/health")["cancelled"] == 4 and get_json(url + "/health")["active"] == 0)
        try:
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
            raise AssertionError("the answer came before the client gave up")
        except httpx.ReadTimeout:  # the client gives up and closes the connection
            pass
        wait_until(lambda: get_json(url + "/health")["cancelled"] == 8 and get_json(url + "/health")["active"] == 0)
        health = get_json(url + "/health")
    assert health["completed"] == 0 and health["waiting"] == 0


def test_max_context_shrinks_the_limits_not_the_replies():
    """--max-context 24 on a 64-token model: the pool holds at most 2 rows x 24 tokens, requests past 24 tokens
    are 400s naming 24, and replies that fit equal the engine's (full-context) greedy replies."""
    from serve_helpers import ref_completion

    model, tok = byte_model(max_seq_len=64)
    app = create_app(model, tok, "m", max_context=24, max_batch=2)
    assert app.state.serve.scheduler.space.pool.capacity == 2 * 24 // 16 + 1  # 2 rows x 2 blocks of 16 (24 tokens)
    with TestClient(app) as http:
        for body in ({**BODY, "prompt": "x" * 30}, {**BODY, "prompt": "abc", "max_tokens": 30}):
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            assert "24" in r.json()["error"]["message"]
        for prompt in ("hello", "abc", "0123456789"):  # 3 rows through a 2-row cache: rows leave, shift, join
            r = http.post("/v1/completions", json={**BODY, "prompt": prompt, "max_tokens": 12, "n": 3})
            assert r.status_code == 200, r.text
            assert [c["text"] for c in r.json()["choices"]] == [ref_completion((model, tok), prompt, 12)] * 3
    with pytest.raises(ValueError, match="--max-context 65 must be between 2 and the model's context"):
        create_app(model, tok, "m", max_context=65)


def test_kv_memory_is_the_pool_and_a_small_pool_caps_the_context():
    """Memory at start is the pool (--kv-cache-mb / --kv-cache-tokens), not rows x context: the model's whole
    context is served by default; a pool smaller than one context caps the context (400s name it) and the
    replies that fit still equal the engine's."""
    from serve_helpers import ref_completion

    model, tok = byte_model(max_seq_len=64)
    state = create_app(model, tok, "m", max_batch=32, kv_cache_mb=0.05).state.serve
    pool = state.scheduler.space.pool
    per_block = 2 * model.config.n_layers * 16 * model.config.n_kv_heads * model.config.head_dim * 4
    assert state.context == 64 and pool.capacity == int(0.05 * (1 << 20)) // per_block < 32 * 64 // 16
    assert state.scheduler.stats.decode_window_bytes == 0 and pool.used == 0
    app = create_app(model, tok, "m", max_batch=4, kv_cache_tokens=40)
    assert app.state.serve.context == 48 and app.state.serve.scheduler.space.pool.capacity == 3
    with TestClient(app) as http:
        r = http.post("/v1/completions", json={**BODY, "prompt": "abc", "max_tokens": 46})
        assert r.status_code == 400 and "48" in r.json()["error"]["message"]
        r = http.post("/v1/completions", json={**BODY, "prompt": "abc", "max_tokens": 40, "n": 2})  # > the pool
        assert r.status_code == 200 and [c["text"] for c in r.json()["choices"]] == [
            ref_completion((model, tok), "abc", 40)] * 2
        assert http.get("/health").json()["preempted"] > 0  # the two choices took turns in the 3 blocks


def test_speculative_serving_keeps_the_greedy_replies():
    """create_app(speculative="ngram") (serve --speculative ngram): streamed and whole replies equal the engine's;
    --speculative draft without a draft model, a draft of another vocabulary or tokenizer are refused."""
    from serve_helpers import ref_completion

    from scratchlm.serve.launch import check_same_tokenizer

    model, tok = byte_model(max_seq_len=64)
    app = create_app(model, tok, "m", speculative="ngram", draft_tokens=3)
    with TestClient(app) as http:
        for prompt in ("abcabcabc", "hello hello hello"):
            r = http.post("/v1/completions", json={**BODY, "prompt": prompt, "max_tokens": 30})
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == ref_completion((model, tok), prompt, 30)
    assert app.state.serve.scheduler.rows_impl.drafted > 0
    with pytest.raises(ValueError, match="needs --draft-model"):
        create_app(model, tok, "m", speculative="draft")
    other, _ = byte_model(max_seq_len=64)
    other.config.vocab_size = 300
    with pytest.raises(ValueError, match="draft model's vocabulary"):
        create_app(model, tok, "m", speculative="draft", draft_model=other)
    from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

    check_same_tokenizer(tok, tok, 259)
    shifted = Tokenizer({i: bytes([(i + 1) % 256]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    with pytest.raises(ValueError, match="another tokenizer"):
        check_same_tokenizer(tok, shifted, 259)
