"""Post-training datasets (JSONL, one object per line) and their tokenisation.

chat:        {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
             -> ids + loss mask (1 on assistant tokens) via the ChatML template. At least one assistant turn.
preference:  {"prompt": str | messages, "chosen": str, "rejected": str}
rl prompts:  {"prompt": str | messages, "reward": NAME, ...fields for the reward, e.g. "answer": "7"}
             ("reward" may be omitted when a default reward name is given).
Prompt rule: a prompt given as a list of messages is rendered with the chat template plus the
generation prompt, and completions end with the reply's end token (<|im_end|> in ChatML, <|eot_id|> for
Llama-3, <end_of_turn> for Gemma, ...); a prompt given as a plain string is encoded as is, after the
tokenizer's BOS if it adds one (raw completion task), and completions end with <|endoftext|> (or the
model's end token). The chat template is the model's own when it has one (pass its
data.chat_format.ChatFormat as `fmt`; without `fmt`, the tokenizer's own: tok.chat_template), else
scratchlm's ChatML (<|im_start|>role\n...<|im_end|>, replies end with <|im_end|>).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from scratchlm.data.chat_format import EOT, ChatFormat, chat_format_of_tokenizer
from scratchlm.data.jsonl import check_messages, read_jsonl, require_str

__all__ = ["EOT", "PreferencePair", "RLPrompt", "encode_chat", "encode_completion", "encode_preferences",
           "encode_prompt", "encode_rl_prompts", "end_token", "load_chat_jsonl", "load_preference_jsonl",
           "load_rl_prompts_jsonl"]


@dataclass
class PreferencePair:
    prompt: str | list[dict[str, str]]
    chosen: str
    rejected: str


@dataclass
class RLPrompt:
    prompt: str | list[dict[str, str]]
    reward: str
    fields: dict[str, Any] = field(default_factory=dict)
    ids: list[int] | None = None  # the encoded prompt (encode_rl_prompts), else encoded with ChatML on use
    end_id: int | None = None  # the token that ends a completion of it


def _prompt(record: dict[str, Any]) -> str | list[dict[str, str]]:
    p = record.get("prompt")
    if isinstance(p, list):
        return check_messages(p, "prompt")
    return require_str(record, "prompt")


def _chat(record: dict[str, Any]) -> list[dict[str, str]]:
    messages = check_messages(record.get("messages"))
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("the conversation has no assistant message, so SFT has nothing to learn from it")
    return messages


def _preference(record: dict[str, Any]) -> PreferencePair:
    return PreferencePair(_prompt(record), require_str(record, "chosen"), require_str(record, "rejected"))


def load_chat_jsonl(path: str | Path) -> list[list[dict[str, str]]]:
    """Conversations from chat JSONL (module docstring)."""
    return read_jsonl(path, _chat, "chat")


def load_preference_jsonl(path: str | Path) -> list[PreferencePair]:
    """Pairs from preference JSONL (module docstring)."""
    return read_jsonl(path, _preference, "preference")


def load_rl_prompts_jsonl(path: str | Path, default_reward: str | None = None,
                          known_rewards: Collection[str] | None = None) -> list[RLPrompt]:
    """RL prompts; each names its reward function or uses default_reward. known_rewards: the valid names
    (align.rewards.REWARDS, passed in by the caller: data/ sits below align/); None checks only that
    every prompt has one."""

    def parse(record: dict[str, Any]) -> RLPrompt:
        name = record.get("reward", default_reward)
        if name is None or (known_rewards is not None and name not in known_rewards):
            valid = f"; valid: {sorted(known_rewards)}" if known_rewards is not None else ""
            raise ValueError(f"reward {name!r} is not a known reward function{valid} "
                             "(set \"reward\" on the line or pass a default)")
        fields = {k: v for k, v in record.items() if k not in ("prompt", "reward")}
        return RLPrompt(_prompt(record), name, fields)

    return read_jsonl(path, parse, "RL prompt")


def end_token(tok: Any, prompt: str | list, fmt: ChatFormat | None = None) -> int:
    """The id that ends a completion of this prompt (data.chat_format: the reply end or <|endoftext|>)."""
    return (fmt or chat_format_of_tokenizer(tok)).end_id(tok, prompt)


def encode_prompt(tok: Any, prompt: str | list[dict[str, str]], fmt: ChatFormat | None = None) -> list[int]:
    """Prompt ids: chat template + generation prompt for messages, BOS (if any) + text for a string."""
    return (fmt or chat_format_of_tokenizer(tok)).encode_prompt(tok, prompt)


def encode_completion(tok: Any, prompt: str | list, text: str, fmt: ChatFormat | None = None) -> list[int]:
    """Completion ids: the text followed by the end token for this kind of prompt."""
    return list(tok.encode_ordinary(text)) + [end_token(tok, prompt, fmt)]


def encode_chat(tok: Any, conversations: list[list[dict[str, str]]],
                fmt: ChatFormat | None = None) -> list[tuple[list[int], list[int]]]:
    """(ids, loss_mask) per conversation: the chat template's rendering and its assistant mask."""
    fmt = fmt or chat_format_of_tokenizer(tok)
    return [fmt.encode_chat(tok, messages) for messages in conversations]


def encode_preferences(tok: Any, pairs: list[PreferencePair],
                       fmt: ChatFormat | None = None) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt_ids, chosen_ids, rejected_ids) per pair."""
    fmt = fmt or chat_format_of_tokenizer(tok)
    return [(encode_prompt(tok, p.prompt, fmt), encode_completion(tok, p.prompt, p.chosen, fmt),
             encode_completion(tok, p.prompt, p.rejected, fmt)) for p in pairs]


def encode_rl_prompts(tok: Any, examples: list[RLPrompt], fmt: ChatFormat | None = None) -> list[RLPrompt]:
    """Fill each prompt's ids and end token under `fmt` (in place); returns the list."""
    fmt = fmt or chat_format_of_tokenizer(tok)
    for ex in examples:
        ex.ids, ex.end_id = encode_prompt(tok, ex.prompt, fmt), end_token(tok, ex.prompt, fmt)
    return examples
