"""How post-training data becomes ids: the model's own chat template, or scratchlm's ChatML.

    ChatFormat()                                  scratchlm's ChatML (tokenizer.chat_template.render_chat)
    ChatFormat(template, reply_end_id, text_end_id)   a model's Jinja template (tokenizer.jinja_template)

    fmt.encode_chat(tok, messages)    (ids, loss mask): the mask is 1 on the assistant replies and the token
                                      that ends each (ChatML: content + <|im_end|>; a model template: the
                                      template's assistant mask, found as transformers finds it)
    fmt.encode_prompt(tok, prompt)    messages -> the rendering with the generation prompt; a str as is (after
                                      the BOS the tokenizer's post-processor adds, if any: tok.prompt_ids)
    fmt.end_id(tok, prompt)           the token that ends a completion: the reply end for messages
                                      (<|im_end|> under ChatML, the template's end-of-turn token otherwise),
                                      <|endoftext|> (or the model's end token) for a raw string prompt
`reply_end_of(template, tok, stop_ids)` finds a template's end-of-turn token by rendering a reply and
taking the first stop token that follows it (ChatTemplate.end_of_turn_id). `chat_format_of_tokenizer(tok)`
is the format a tokenizer carries itself (tok.chat_template, attached by the loaders), else ChatML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scratchlm.tokenizer.chat.render import IM_END, render_chatml

EOT = "<|endoftext|>"


@dataclass
class ChatFormat:
    """One model's way of turning messages into ids (module docstring)."""

    template: Any = None  # a tokenizer.jinja_template.ChatTemplate, or None for ChatML
    reply_end_id: int | None = None  # the template's end-of-turn token
    text_end_id: int | None = None  # what ends a raw completion when the vocab has no <|endoftext|>

    def encode_chat(self, tok: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
        if self.template is None:
            return render_chatml(tok, messages)
        return self.template.encode(tok, messages)

    def encode_prompt(self, tok: Any, prompt: str | list[dict[str, str]]) -> list[int]:
        if not isinstance(prompt, list):
            return list(tok.prompt_ids(prompt))
        if self.template is None:
            return render_chatml(tok, prompt, add_generation_prompt=True)[0]
        return list(tok.encode(self.template.render(prompt, add_generation_prompt=True)))

    def end_id(self, tok: Any, prompt: str | list) -> int:
        specials = getattr(tok, "special_token_ids", {}) or {}
        if isinstance(prompt, list):
            if self.template is not None:
                if self.reply_end_id is None:
                    raise ValueError("this chat template's end-of-turn token is unknown (no stop token follows an "
                                     "assistant reply in its rendering)")
                return self.reply_end_id
            name = IM_END
        else:
            if EOT not in specials and self.text_end_id is not None:
                return self.text_end_id
            name = EOT
        if name not in specials:
            raise ValueError(f"the tokenizer has no {name} special token; train it with the default special tokens")
        return specials[name]


def chat_format_of(loaded: Any) -> ChatFormat:
    """The ChatFormat of a scratchlm.load.model_loader.LoadedModel: its own template (with its named special tokens)
    when it ships one, else ChatML; raw completions end with <|endoftext|> or the model's first stop token."""
    from scratchlm.tokenizer.chat.template import ChatTemplate

    stops = list(loaded.stop_token_ids or [])
    text_end = stops[0] if stops else None
    if not loaded.chat_template:
        return ChatFormat(text_end_id=text_end)
    names = {}
    for key, value in (loaded.tokenizer_config or {}).items():
        value = value.get("content") if isinstance(value, dict) else value
        if key.endswith("_token") and isinstance(value, str) and value:
            names[key] = value
    template = ChatTemplate(loaded.chat_template, names)
    return ChatFormat(template, reply_end_of(template, loaded.tokenizer, stops), text_end)


def reply_end_of(template: Any, tok: Any, stop_ids: list[int]) -> int | None:
    """The first of `stop_ids` that the template writes right after an assistant reply, or None."""
    return template.end_of_turn_id(tok, stop_ids) if stop_ids else None  # None when no stop token follows


def chat_format_of_tokenizer(tok: Any) -> ChatFormat:
    """The format a tokenizer carries: its own template (tok.chat_template, set by the loaders for HF
    dirs and GGUF files) with its end-of-turn token, else ChatML."""
    eos = (getattr(tok, "special_tokens_map", None) or {}).get("eos_token")
    text_end = tok.special_token_ids.get(eos) if eos else None
    template = getattr(tok, "chat_template", None)
    if template is None:
        return ChatFormat(text_end_id=text_end)
    return ChatFormat(template, template.end_of_turn_id(tok), text_end)
