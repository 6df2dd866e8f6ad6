"""`scratchlm sft`: supervised fine-tuning on chat JSONL, loss on assistant tokens only.

    scratchlm sft --checkpoint runs/base --data chat.jsonl --out runs/sft --steps 200 --lr 1e-4
    scratchlm sft ... --lora-r 8 --lora-targets q_proj,k_proj,v_proj,o_proj [--merge]   # LoRA
    scratchlm sft ... --resume                # continue an interrupted run from OUT/checkpoint
"""

from __future__ import annotations

import argparse

from scratchlm.align.sft_trainer import SFTTrainConfig, sft_eval_loss, train_sft
from scratchlm.cli.align_common import (add_common_args, add_lora_args, checkpoint_options, finish, load_policy,
                                         optim_from_args, prepare_output)
from scratchlm.data.align_data import encode_chat, load_chat_jsonl
from scratchlm.data.chat_format import chat_format_of


def run(args: argparse.Namespace) -> int:
    replaced = prepare_output(args)
    model, tok = load_policy(args)
    examples = encode_chat(tok, load_chat_jsonl(args.data), chat_format_of(args.loaded))
    cfg = SFTTrainConfig(steps=args.steps, batch_size=args.batch_size, micro_batch=args.micro_batch, pack=args.pack,
                         seq_len=args.seq_len, seed=args.seed, optim=optim_from_args(args))
    start = sft_eval_loss(model, examples)
    history = train_sft(model, examples, cfg, checkpoint=checkpoint_options(args))
    end = sft_eval_loss(model, examples)
    return finish(model, tok, args, cfg, history, {"assistant_loss_start": start, "assistant_loss_end": end},
                  replaced)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="supervised fine-tuning on chat JSONL (assistant tokens only)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, 'chat JSONL: {"messages": [{"role": ..., "content": ...}, ...]} per line', 1e-4, 100,
                    "cosine")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=None,
                   help="rows per forward/backward (gradient accumulation; default: the whole batch)")
    p.add_argument("--pack", action="store_true", help="pack examples into rows of --seq-len tokens")
    p.add_argument("--seq-len", type=int, default=256, help="row length when packing")
    add_lora_args(p)
    p.set_defaults(func=run)
