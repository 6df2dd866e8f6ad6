"""`scratchlm chat`: an interactive multi-turn REPL over a checkpoint, in the model's chat format.

    scratchlm chat --checkpoint runs/sft --system "You are terse." --temperature 0.7 --top-p 0.9
Each turn renders the whole conversation with the model's own chat template when it ships one (HF
tokenizer_config.json / chat_template.jinja, GGUF metadata), else scratchlm's ChatML, plus the
generation prompt (`chat_prompt_ids`), and streams the reply until a stop token (the model's eos /
end-of-turn ids; <|im_end|> / <|endoftext|> for ChatML), a --stop string, or --max-new-tokens.
Context policy: when conversation + max_new_tokens exceed the model's max_seq_len, the oldest
user/assistant turns are dropped (the system message is kept) and a note goes to stderr; if the
last message alone does not fit, the turn is refused with the engine's context-overflow error.
Commands: /reset clears the history, /exit (or Ctrl-D / end of input) quits.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from scratchlm.cli.generate import add_model_args, add_sampling_args, load_for_generation, sampling_kwargs, write_stream
from scratchlm.generate.streaming import stream_generate


def fit_history(tokenizer: Any, messages: list[dict], room: int) -> tuple[list[int], int]:
    """Render messages (+ generation prompt), dropping the oldest non-system turns while over `room`.

    Mutates `messages`; returns (prompt ids, number of messages dropped)."""
    from scratchlm.tokenizer.chat_template import chat_prompt_ids

    dropped = 0
    while True:
        ids = chat_prompt_ids(tokenizer, messages)
        first = 1 if messages and messages[0]["role"] == "system" else 0
        if len(ids) <= room or len(messages) - first <= 1:
            return ids, dropped
        del messages[first]
        dropped += 1


def chat_turn(loaded, messages: list[dict], args: argparse.Namespace, kw: dict[str, Any]) -> str:
    """Stream one assistant reply to the conversation and return its text."""
    model, tokenizer = loaded.model, loaded.tokenizer
    ids, dropped = fit_history(tokenizer, messages, model.config.max_seq_len - args.max_new_tokens)
    if dropped:
        print(f"[context full: dropped the {dropped} oldest message(s)]", file=sys.stderr)
    return write_stream(stream_generate(model, tokenizer, ids, args.max_new_tokens,
                                        stop_token_ids=loaded.stop_token_ids, **kw))


def run_chat(args: argparse.Namespace) -> int:
    loaded = load_for_generation(args)
    kw = sampling_kwargs(args)
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
            reply = chat_turn(loaded, messages, args, kw)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            messages.pop()
            continue
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="interactive multi-turn chat with a checkpoint (the model's template, streaming)")
    add_model_args(p)
    p.add_argument("--system", default="", help="system message kept at the top of the conversation")
    add_sampling_args(p, max_new_tokens=256)
    p.set_defaults(func=run_chat)
