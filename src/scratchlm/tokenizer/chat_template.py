"""ChatML chat template: messages -> (ids, loss_mask).

    per message:           <|im_start|>{role}\\n{content}<|im_end|>\\n
    generation prompt:     <|im_start|>assistant\\n

loss_mask is 1 exactly on the tokens of assistant contents and on their closing <|im_end|>, 0 elsewhere.
The header "{role}\\n", the content and the trailing "\\n" are encoded separately, so a content token
never straddles the header; contents are plain text (a "<|im_end|>" typed in a message stays text and
cannot end the turn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scratchlm.tokenizer.pipeline import Tokenizer

DEFAULT_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# Tokens that end a turn in the common chat formats (ChatML, Llama-3, Gemma, Phi): generation stops there.
END_OF_TURN_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")


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


def render_chat(tok: "Tokenizer", messages: list[dict], add_generation_prompt: bool = False) -> tuple[list[int], list[int]]:
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
