"""The chat page in a real headless browser (Debian chromium driven by playwright): type a message,
watch the reply stream in, check it equals the engine's greedy reply, then a second turn that sends
the whole conversation back."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import sync_playwright

from tiny_checkpoint import API_KEY, MODEL
from serve_helpers import ref_chat

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WATCH = """() => {
  window.__snapshots = [];
  new MutationObserver(() => {
    const all = document.querySelectorAll('#messages .assistant');
    if (all.length) window.__snapshots.push(all[all.length - 1].textContent);
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture
def page(server, tmp_path):
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = context.new_page()
            page.goto(server.url + "/")
            yield page
        finally:
            context.close()


def set_value(page, selector: str, value: str) -> None:
    page.eval_on_selector(selector, "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", value)


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('done')", timeout=60_000)


def test_chat_page_streams_a_reply_and_keeps_the_conversation(page, reference):
    page.fill("#api_key", API_KEY)
    page.dispatch_event("#api_key", "change")
    page.wait_for_function(f"() => document.getElementById('model').textContent === '{MODEL}'", timeout=30_000)
    set_value(page, "#temperature", "0")
    set_value(page, "#max_tokens", "300")
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.method == "POST" else None)
    page.evaluate(WATCH)

    first = "Good morrow, what news?"
    send(page, first)
    reply = page.locator("#messages .assistant").last.text_content()
    turn1 = [{"role": "user", "content": first}]
    assert reply == ref_chat(reference, turn1, 300)
    snapshots = page.evaluate("window.__snapshots")
    partial = [s for s in snapshots if s and s != reply]
    assert partial and all(reply.startswith(s) for s in partial)  # the reply grew in steps: it streamed
    assert bodies[0]["stream"] is True and bodies[0]["messages"] == turn1 and bodies[0]["temperature"] == 0

    set_value(page, "#max_tokens", "16")
    second = "And then?"
    send(page, second)
    turn2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": second}]
    assert bodies[1]["messages"] == turn2 and bodies[1]["max_tokens"] == 16
    assert page.locator("#messages .assistant").last.text_content() == ref_chat(reference, turn2, 16)
    assert page.locator("#messages .user").count() == 2
