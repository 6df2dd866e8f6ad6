"""`scratchlm chat`: an interactive multi-turn REPL over a checkpoint, in the model's chat format.

    scratchlm chat --checkpoint runs/sft --system "You are terse." --temperature 0.7 --top-p 0.9
Each turn renders the whole conversation with the model's own chat template when it ships one (HF
tokenizer_config.json / chat_template.jinja, GGUF metadata), else scratchlm's ChatML, plus the
generation prompt (`chat_prompt_ids`), and streams the reply until a stop token (the model's eos /
end-of-turn ids; <|im_end|> / <|endoftext|> for ChatML), a --stop string, or --max-new-tokens.
Context policy: the reply budget is --max-new-tokens, by default min(256, half the model's context)
(said on stderr when capped); an explicit budget that leaves no room for a message is refused at
start. When conversation + budget exceed the model's max_seq_len, the oldest user/assistant turns
are dropped (the system message is kept) and a note goes to stderr; a default budget then shrinks
to the room left (said on stderr). If the last message still does not fit, the turn fails with a
one-line error: piped input stops there (exit 2), an interactive session goes on and exits 2 at the end.
Commands: /reset clears the history, /exit (or Ctrl-D / end of input) quits.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scratchlm.cli.generate import (add_model_args, add_sampling_args, add_speculative_args, load_for_generation,
                                    sampling_kwargs, speculation, write_stream)
from scratchlm.generate.streaming import stream_generate


def fit_history(tokenizer: Any, messages: list[dict], room: int) -> tuple[list[int], int]:
    """Render messages (+ generation prompt), dropping the oldest non-system turns while over `room`.

    Mutates `messages`; returns (prompt ids, number of messages dropped)."""
    from scratchlm.tokenizer.chat.render import chat_prompt_ids

    dropped = 0
    while True:
        ids = chat_prompt_ids(tokenizer, messages)
        first = 1 if messages and messages[0]["role"] == "system" else 0
        if len(ids) <= room or len(messages) - first <= 1:
            return ids, dropped
        del messages[first]
        dropped += 1


def reply_budget(args: argparse.Namespace, max_seq_len: int) -> int:
    """Tokens per reply: --max-new-tokens, or its default capped to half the context (module docstring)."""
    if args.max_new_tokens is not None:
        if not 0 < args.max_new_tokens < max_seq_len:
            raise ValueError(f"--max-new-tokens {args.max_new_tokens} must be between 1 and {max_seq_len - 1}: "
                             f"the model's context is {max_seq_len} tokens and the conversation needs room too")
        return args.max_new_tokens
    n = min(args.default_max_new_tokens, max(1, max_seq_len // 2))
    if n < args.default_max_new_tokens:
        print(f"[--max-new-tokens {n}: replies get half of the model's {max_seq_len}-token context; the default "
              f"{args.default_max_new_tokens} does not fit]", file=sys.stderr)
    return n


def chat_turn(loaded, messages: list[dict], budget: int, explicit: bool, kw: dict[str, Any]) -> str:
    """Stream one assistant reply to the conversation and return its text (context policy: module docstring)."""
    model, tokenizer, ctx = loaded.model, loaded.tokenizer, loaded.model.config.max_seq_len
    ids, dropped = fit_history(tokenizer, messages, ctx - budget)
    if dropped:
        print(f"[context full: dropped the {dropped} oldest message(s)]", file=sys.stderr)
    if not explicit and len(ids) + budget > ctx:  # a default budget shrinks to the room left
        if len(ids) >= ctx:
            raise ValueError(f"the last message is {len(ids)} tokens with the chat template, which fills the "
                             f"model's {ctx}-token context; shorten it")
        budget = ctx - len(ids)
        print(f"[reply capped to {budget} tokens: the conversation fills the rest of the {ctx}-token context]",
              file=sys.stderr)
    return write_stream(stream_generate(model, tokenizer, ids, budget, stop_token_ids=loaded.stop_token_ids, **kw))


def run_chat(args: argparse.Namespace) -> int:
    loaded = load_for_generation(args)
    kw = {**sampling_kwargs(args), "speculative": speculation(args, loaded)}
    budget = reply_budget(args, loaded.model.config.max_seq_len)
    failed = 0
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    tty = sys.stdin.isatty()
    print(f"chatting with {args.checkpoint}: /reset clears the history, /exit or Ctrl-D quits", file=sys.stderr)
    while True:
        try:
            line = input("you> " if tty else "")
        except EOFError:
            break
        text = line.strip()
        if text == "/exit":
            break
        if text == "/reset":
            messages = list(system)
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": line})
        if tty:
            sys.stdout.write("assistant> ")
        try:
            reply = chat_turn(loaded, messages, budget, args.max_new_tokens is not None, kw)
        except ValueError as exc:
            if not tty:
                raise  # piped input: one line, exit 2 (scratchlm.cli.main)
            print(f"{args.command_parser.prog}: error: {exc}", file=sys.stderr)
            messages.pop()
            failed += 1
            continue
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})
    if failed:
        print(f"{args.command_parser.prog}: error: {failed} turn(s) failed (see above)", file=sys.stderr)
    return 2 if failed else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="interactive multi-turn chat with a checkpoint (the model's template, streaming)")
    add_model_args(p)
    p.add_argument("--system", default="", help="system message kept at the top of the conversation")
    add_sampling_args(p, max_new_tokens=256)
    add_speculative_args(p)
    p.set_defaults(func=run_chat)
