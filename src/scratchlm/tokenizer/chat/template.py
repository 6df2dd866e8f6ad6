"""A model's own chat template (Jinja), rendered exactly as transformers' `apply_chat_template`, plus
token ids and the assistant-token mask for SFT.

    tmpl = ChatTemplate(source, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    text = tmpl.render(messages, add_generation_prompt=True, tools=[...])      # == HF's tokenize=False
    ids, mask = tmpl.encode(tokenizer, messages)                               # ids == HF's input_ids

Variables the template sees: messages, tools, documents, add_generation_prompt, the tokenizer's named
special tokens (bos_token, eos_token, ... as strings), and any extra keyword (they override).
Ids: the rendered text encoded with add_special_tokens=False (the template writes BOS itself).

Assistant mask (1 = a token SFT trains on):
  * template with {% generation %} blocks (HF's way): the tokens whose char offsets fall inside a block,
    found as transformers does (token holding the first char .. token holding the last char);
  * otherwise, by prefix difference: for each assistant message i, P = render(messages[:i]) with the
    generation prompt and Q = render(messages[:i + 1]); the chars from len(P) to the end of Q, without
    Q's trailing whitespace, are the reply (content and the end-of-turn token, e.g. "Hi<|im_end|>").
    This needs a template whose rendering of a conversation starts with its rendering of every
    prefix; one that rewrites earlier turns is refused with a clear error.
"""

from __future__ import annotations

import re
from typing import Any

import jinja2

from scratchlm.tokenizer.chat.jinja_env import compile_template
from scratchlm.tokenizer.chat.template_data import plain, prepare_documents, prepare_messages, prepare_tools

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
PROBE = "probe reply 7f3a"


class ChatTemplate:
    """One model's chat template(s): a Jinja source, or {name: source} (e.g. "default", "tool_use")."""

    def __init__(self, source: str | dict[str, str], special_tokens: dict[str, str] | None = None) -> None:
        if isinstance(source, str):
            source = {"default": source}
        if not source or not all(isinstance(k, str) and isinstance(v, str) for k, v in source.items()):
            raise ValueError("a chat template must be a Jinja string or a {name: Jinja string} dict")
        self.templates = dict(source)
        self.special_tokens = {k: str(v) for k, v in (special_tokens or {}).items() if v is not None}
        for s in self.templates.values():
            compile_template(s)  # syntax errors now, not at the first chat

    def __repr__(self) -> str:
        return f"ChatTemplate({sorted(self.templates)}, special_tokens={sorted(self.special_tokens)})"

    @property
    def source(self) -> str:
        """The default template's Jinja source."""
        return self.select(None, None)

    def select(self, name: str | None, tools: Any) -> str:
        """The template to use: `name`, else "tool_use" when tools are given and it exists, else "default"."""
        if name is None:
            name = "tool_use" if tools is not None and "tool_use" in self.templates else "default"
        if name not in self.templates:
            if len(self.templates) == 1 and name == "default":
                return next(iter(self.templates.values()))
            raise ValueError(f"chat template {name!r} does not exist; this tokenizer has {sorted(self.templates)}")
        return self.templates[name]

    def has_generation_blocks(self, name: str | None = None, tools: Any = None) -> bool:
        return GENERATION_TAG.search(self.select(name, tools)) is not None

    # -- rendering ----------------------------------------------------------------------------
    def _context(self, messages: Any, add_generation_prompt: bool, tools: Any, documents: Any,
                 extra: dict) -> dict:
        return {**self.special_tokens, **plain(extra), "messages": prepare_messages(messages),
                "tools": prepare_tools(tools), "documents": prepare_documents(documents),
                "add_generation_prompt": add_generation_prompt}

    def _render(self, source: str, ctx: dict, spans: list | None) -> str:
        template = compile_template(source)
        try:
            if spans is None:
                return template.render(**ctx)
            blocks: list[str] = []
            with template.environment.track_generation(blocks, spans):
                for chunk in template.generate(**ctx):
                    blocks.append(chunk)
            return "".join(blocks)
        except jinja2.exceptions.TemplateError as exc:
            raise ValueError(f"chat template error: {exc}") from None

    def render(self, messages: Any, add_generation_prompt: bool = False, tools: Any = None, documents: Any = None,
               *, continue_final_message: bool = False, template_name: str | None = None, **extra: Any) -> str:
        """The conversation as text, exactly as transformers' apply_chat_template(tokenize=False)."""
        return self.render_with_spans(messages, add_generation_prompt, tools, documents,
                                      continue_final_message=continue_final_message, template_name=template_name,
                                      track=False, **extra)[0]

    def render_with_spans(self, messages: Any, add_generation_prompt: bool = False, tools: Any = None,
                          documents: Any = None, *, continue_final_message: bool = False,
                          template_name: str | None = None, track: bool = True,
                          **extra: Any) -> tuple[str, list[tuple[int, int]]]:
        """(text, char spans of the {% generation %} blocks)."""
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot be used together")
        source = self.select(template_name, tools)
        ctx = self._context(messages, add_generation_prompt, tools, documents, extra)
        final = None
        if continue_final_message:
            final = ctx["messages"][-1].get("content")
            if not isinstance(final, str):
                raise ValueError("continue_final_message needs a final message with string content")
            ctx["messages"][-1]["content"] = final + CONTINUE_TAG
        spans: list[tuple[int, int]] | None = [] if track else None
        text = self._render(source, ctx, spans)
        if final is not None:
            text = _cut_at_continue_tag(text, final)
        return text, spans or []

    def end_of_turn_id(self, tokenizer: Any, stop_ids: list[int] | None = None) -> int | None:
        """The token the template writes right after an assistant reply (<|im_end|>, <|eot_id|>,
        <end_of_turn>, </s>, ...): render [user, assistant=PROBE] and take the first token after PROBE that
        is one of `stop_ids` (default: any added token, else the eos_token). None if there is none."""
        text = self.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}])
        at = text.find(PROBE)
        wanted = set(stop_ids) if stop_ids is not None else set(tokenizer.added.by_id)
        if at >= 0:
            for i in tokenizer.encode(text[at + len(PROBE):]):
                if i in wanted:
                    return i
        return tokenizer.token_to_id(self.special_tokens.get("eos_token", "")) if stop_ids is None else None

    # -- ids and the assistant mask -----------------------------------------------------------
    def encode(self, tokenizer: Any, messages: Any, add_generation_prompt: bool = False, tools: Any = None,
               documents: Any = None, **extra: Any) -> tuple[list[int], list[int]]:
        """(ids, assistant mask) of the rendered conversation (module docstring)."""
        if self.has_generation_blocks(extra.get("template_name"), tools):
            text, spans = self.render_with_spans(messages, add_generation_prompt, tools, documents, **extra)
        else:
            text = self.render(messages, add_generation_prompt, tools, documents, **extra)
            spans = self.reply_spans(messages, text, tools, documents, **extra)
        enc = tokenizer.encode_with_offsets(text)
        return enc.ids, spans_to_mask(enc, spans)

    def reply_spans(self, messages: Any, text: str, tools: Any = None, documents: Any = None,
                    **extra: Any) -> list[tuple[int, int]]:
        """Char spans of the assistant replies in `text`, by prefix difference (module docstring)."""
        spans = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") != "assistant":
                continue
            if i == 0:
                raise ValueError("the conversation starts with an assistant message; the assistant mask needs the "
                                 "turns before each reply (start with a system or user message)")
            before = self.render(messages[:i], True, tools, documents, **extra)
            upto = self.render(messages[: i + 1], False, tools, documents, **extra)
            if not (upto.startswith(before) and text.startswith(upto)):
                raise ValueError(
                    f"this chat template renders message #{i} differently once later messages follow (it rewrites "
                    "earlier turns), so the assistant mask cannot be found by prefix difference; use a template "
                    "with {% generation %} blocks around the assistant replies")
            end = len(upto.rstrip())
            if end > len(before):
                spans.append((len(before), end))
        return spans


def _cut_at_continue_tag(text: str, final: str) -> str:
    """Drop everything the template writes after the final message (transformers' continue_final_message)."""
    if final.strip() not in text or CONTINUE_TAG.strip() not in text:
        raise ValueError("continue_final_message: the chat template does not render the final message as given")
    at = text.rindex(CONTINUE_TAG.strip())
    if text[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


def spans_to_mask(enc: Any, spans: list[tuple[int, int]]) -> list[int]:
    """1 on the tokens from the one holding a span's first char to the one holding its last char."""
    mask = [0] * len(enc.ids)
    for start, end in spans:
        first = enc.char_to_token(start)
        last = enc.char_to_token(end - 1)
        if first is None:
            break  # as transformers: a span that starts on no token ends the marking
        for k in range(first, last + 1 if last else len(mask)):  # `if last`: transformers' test, 0 included
            mask[k] = 1
    return mask
