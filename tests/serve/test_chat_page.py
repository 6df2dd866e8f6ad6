"""The chat page in a real headless browser (Debian chromium driven by playwright).

Before a key is typed the page asks nothing that needs one (no 401 in the console). Then three turns on a
384-token model with max_tokens 150: each reply equals the engine's greedy reply to exactly the messages
the page sent; by the third turn the conversation no longer fits, so the page leaves the oldest turn out
and says so; every reply shows its token counts (the prompt count equals the chat template's). Over the
whole session the browser logs no console error, no page error and no failed or >= 400 request."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import sync_playwright

from scratchlm.tokenizer import render_chat

from serve_helpers import ref_chat
from tiny_checkpoint import API_KEY, CONTEXT, MODEL

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MAX_TOKENS = 150


@pytest.fixture
def browser_page(server, tmp_path):
    problems: list[str] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = context.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
            page.on("response", lambda r: problems.append(f"{r.status}: {r.url}") if r.status >= 400 else None)
            page.goto(server.url + "/")
            yield page, problems
        finally:
            context.close()


def set_value(page, selector: str, value: str) -> None:
    page.eval_on_selector(selector, "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", value)


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_function("() => /^(done|error)/.test(document.getElementById('status').textContent)",
                           timeout=60_000)
    assert page.text_content("#status").startswith("done"), page.text_content("#status")


def test_chat_page_trims_history_counts_tokens_and_logs_no_errors(browser_page, reference):
    page, problems = browser_page
    page.wait_for_function(f"() => document.getElementById('model').textContent === '{MODEL}'", timeout=30_000)
    assert page.text_content("#context") == str(CONTEXT) and "API key" in page.text_content("#status")
    page.wait_for_timeout(200)
    assert problems == []  # nothing asked before the key: no 401 in the console

    page.fill("#api_key", API_KEY)
    page.dispatch_event("#api_key", "change")
    set_value(page, "#temperature", "0")
    set_value(page, "#max_tokens", str(MAX_TOKENS))
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data))
            if r.url.endswith("/v1/chat/completions") else None)
    _, tok = reference
    sent_turns = []
    for i, text in enumerate(["Good morrow, what news?", "And then?", "Speak again."]):
        send(page, text)
        sent = bodies[-1]["messages"]
        reply = page.locator("#messages .assistant").last.text_content()
        assert reply == ref_chat(reference, sent, bodies[-1]["max_tokens"])
        prompt = len(render_chat(tok, sent, add_generation_prompt=True)[0])
        assert prompt + bodies[-1]["max_tokens"] <= CONTEXT
        counts = page.locator("#messages .tokens").last.text_content()
        assert counts.startswith(f"{prompt} prompt + ") and f"(context {CONTEXT})" in counts
        sent_turns.append(sent)
    assert sent_turns[1][:2] == [sent_turns[0][0], {"role": "assistant", "content": sent_turns[1][1]["content"]}]
    assert sent_turns[2][0] == sent_turns[1][2]  # turn 1 (question + reply) was left out of turn 3
    assert len(sent_turns[2]) == 3 and page.locator("#messages .trimmed").count() == 2
    assert "no longer fits" in page.locator("#messages .notice").last.text_content()
    assert problems == []
