"""`scratchlm sft`: supervised fine-tuning on chat JSONL, loss on assistant tokens only.

    scratchlm sft --checkpoint runs/base --data chat.jsonl --out runs/sft --steps 200 --lr 1e-4
    scratchlm sft ... --lora-r 8 --lora-targets q_proj,k_proj,v_proj,o_proj [--merge]   # LoRA
    scratchlm sft ... --resume                # continue an interrupted run from OUT/checkpoint
"""

from __future__ import annotations

import argparse

from scratchlm.align.sft_trainer import SFTTrainConfig, sft_eval_loss, train_sft
from scratchlm.cli.align_common import add_common_args, add_lora_args, optim_from_args, run_align
from scratchlm.data.align_data import encode_chat, load_chat_jsonl


def run(args: argparse.Namespace) -> int:
    cfg = SFTTrainConfig(steps=args.steps, batch_size=args.batch_size, micro_batch=args.micro_batch, pack=args.pack,
                         seq_len=args.seq_len, seed=args.seed, loss_impl="chunked" if args.fast else "reference",
                         optim=optim_from_args(args))
    return run_align(args, lambda tok, fmt: encode_chat(tok, load_chat_jsonl(args.data), fmt), cfg,
                     lambda model, tok, data, ckpt: train_sft(model, data, cfg, checkpoint=ckpt),
                     measure=("assistant_loss", sft_eval_loss))


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
