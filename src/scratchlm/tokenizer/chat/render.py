"""Chat formatting: messages -> (ids, loss_mask), with the model's own template or scratchlm's ChatML.

`render_chat(tok, messages)` uses `tok.chat_template` (a jinja_template.ChatTemplate: the template a
real model ships, attached by the loaders) when the tokenizer has one, and scratchlm's ChatML, the
default for models scratchlm trains, otherwise:

    per message:           <|im_start|>{role}\\n{content}<|im_end|>\\n
    generation prompt:     <|im_start|>assistant\\n

ChatML's loss_mask is 1 exactly on the tokens of assistant contents and on their closing <|im_end|>, 0
elsewhere. The header "{role}\\n", the content and the trailing "\\n" are encoded separately, so a content
token never straddles the header; contents are plain text (a "<|im_end|>" typed in a message stays
text and cannot end the turn). A model's template renders as transformers does (see jinja_template.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scratchlm.tokenizer.pipeline import Tokenizer

DEFAULT_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Tokens that end a turn in the common chat formats (ChatML, Llama-3, Gemma, Phi): generation stops there.
END_OF_TURN_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")
DEFAULT_STOP_TOKENS = ("<|endoftext|>", "<|im_end|>")  # stop ids of a model that names none (scratchlm's ChatML)


def default_stop_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokenizer's end-of-text / end-of-turn special tokens (those it has): the stop ids of a
    model whose files name none."""
    specials = getattr(tokenizer, "special_token_ids", {}) or {}
    return [specials[s] for s in DEFAULT_STOP_TOKENS if s in specials]


def _special_ids(tok: "Tokenizer") -> tuple[int, int]:
    missing = [s for s in (IM_START, IM_END) if s not in tok.special_token_ids]
    if missing:
        raise ValueError(
            f"tokenizer has no special tokens {missing} needed by the ChatML template; train it with "
            f"--special {' --special '.join(DEFAULT_SPECIAL_TOKENS)} (the default)"
        )
    return tok.special_token_ids[IM_START], tok.special_token_ids[IM_END]


def _check_message(n: int, msg: object) -> tuple[str, str]:
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
        raise ValueError(f"message #{n} must be a dict with str 'role' and 'content', got {msg!r}")
    if not msg["role"] or "\n" in msg["role"]:
        raise ValueError(f"message #{n} role {msg['role']!r} must be non-empty and have no newline")
    return msg["role"], msg["content"]


def render_chat(tok: "Tokenizer", messages: list[dict], add_generation_prompt: bool = False,
                **template_kwargs: Any) -> tuple[list[int], list[int]]:
    """Token ids of `messages` in the tokenizer's chat format and the matching 0/1 loss mask (1 = an
    assistant token to train on). template_kwargs (tools, documents, ...) go to a model's template."""
    template = getattr(tok, "chat_template", None)
    if template is not None:
        return template.encode(tok, messages, add_generation_prompt, **template_kwargs)
    if template_kwargs:
        raise ValueError(f"scratchlm's ChatML takes no {sorted(template_kwargs)}; this tokenizer has no chat template")
    return render_chatml(tok, messages, add_generation_prompt)


def chat_prompt_ids(tok: "Tokenizer", messages: list[dict], **template_kwargs: Any) -> list[int]:
    """Ids of `messages` plus the generation prompt: what a model continues to reply (no mask computed)."""
    template = getattr(tok, "chat_template", None)
    if template is None:
        return render_chat(tok, messages, True, **template_kwargs)[0]
    return tok.encode(template.render(messages, add_generation_prompt=True, **template_kwargs))


def render_chatml(tok: "Tokenizer", messages: list[dict], add_generation_prompt: bool = False) -> tuple[list[int], list[int]]:
    """Token ids of the ChatML rendering of `messages` and the matching 0/1 loss mask."""
    start, end = _special_ids(tok)
    newline = tok.encode_ordinary("\n")
    ids: list[int] = []
    mask: list[int] = []
    for n, msg in enumerate(messages):
        role, content = _check_message(n, msg)
        header = [start] + tok.encode_ordinary(role + "\n")
        body = tok.encode_ordinary(content) + [end]
        train = 1 if role == "assistant" else 0
        ids += header + body + newline
        mask += [0] * len(header) + [train] * len(body) + [0] * len(newline)
    if add_generation_prompt:
        prompt = [start] + tok.encode_ordinary("assistant\n")
        ids += prompt
        mask += [0] * len(prompt)
    return ids, mask
