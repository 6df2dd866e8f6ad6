"""`scratchlm dpo`: Direct Preference Optimization (and IPO, cDPO, robust DPO, hinge) on preference JSONL.

    scratchlm dpo --checkpoint runs/sft --data prefs.jsonl --out runs/dpo --beta 0.1 --loss-type sigmoid
The reference model is a frozen copy of --checkpoint (with --lora-r: the base model, adapters off).
"""

from __future__ import annotations

import argparse

from scratchlm.align.dpo import DPO_LOSS_TYPES
from scratchlm.align.dpo_trainer import DPOTrainConfig, preference_accuracy, train_dpo
from scratchlm.cli.align_common import add_common_args, add_lora_args, optim_from_args, run_align
from scratchlm.data.align_data import encode_preferences, load_preference_jsonl


def run(args: argparse.Namespace) -> int:
    cfg = DPOTrainConfig(steps=args.steps, batch_size=args.batch_size, beta=args.beta, loss_type=args.loss_type,
                         label_smoothing=args.label_smoothing, seed=args.seed, optim=optim_from_args(args))
    return run_align(args, lambda tok, fmt: encode_preferences(tok, load_preference_jsonl(args.data), fmt), cfg,
                     lambda model, tok, data, ckpt: train_dpo(model, data, cfg, checkpoint=ckpt),
                     measure=("preference_accuracy", preference_accuracy))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dpo", help="DPO / IPO / cDPO / robust DPO on preference JSONL",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, 'preference JSONL: {"prompt": str | messages, "chosen": str, "rejected": str}', 1e-5, 100,
                    "constant")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--loss-type", choices=DPO_LOSS_TYPES, default="sigmoid")
    p.add_argument("--label-smoothing", type=float, default=0.0, help="eps for cdpo / robust")
    add_lora_args(p)
    p.set_defaults(func=run)
