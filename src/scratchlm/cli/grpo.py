"""`scratchlm grpo`: the GRPO family (GRPO, Dr. GRPO, DAPO, GSPO) on RL prompt JSONL with verifiable rewards.

    scratchlm grpo --checkpoint runs/sft --data prompts.jsonl --out runs/grpo --preset dapo \
        --group-size 8 --prompts-per-step 8 --steps 50 --lr 1e-5
--preset picks the switches; any flag given explicitly overrides the preset's value.
"""

from __future__ import annotations

import argparse
import dataclasses

from scratchlm.align.grpo import GRPO_PRESETS, IMPORTANCE_LEVELS, PG_LOSS_TYPES, SCALE_REWARDS, GRPOLossConfig, preset
from scratchlm.align.grpo_trainer import GRPOTrainConfig, train_grpo
from scratchlm.align.kl import KL_ESTIMATORS
from scratchlm.align.surrogate import LOSS_AGGREGATIONS
from scratchlm.cli.align_common import (add_common_args, add_lora_args, add_rollout_args, optim_from_args, rl_prompts,
                                         run_align)

LOSS_FLAGS = {f.name for f in dataclasses.fields(GRPOLossConfig)}


def loss_config(args: argparse.Namespace) -> GRPOLossConfig:
    """The preset with every explicitly given loss flag applied on top."""
    overrides = {k: v for k, v in vars(args).items() if k in LOSS_FLAGS and v is not None}
    if "max_completion_length" not in overrides:
        overrides["max_completion_length"] = args.max_new_tokens
    return preset(args.preset, **overrides)


def run(args: argparse.Namespace) -> int:
    cfg = GRPOTrainConfig(
        steps=args.steps, prompts_per_step=args.prompts_per_step, group_size=args.group_size,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, num_iterations=args.num_iterations,
        micro_batch=args.micro_batch, max_refill_rounds=args.max_refill_rounds, seed=args.seed,
        loss=loss_config(args), optim=optim_from_args(args))
    return run_align(args, rl_prompts(args), cfg,
                     lambda model, tok, data, ckpt: train_grpo(model, tok, data, cfg, checkpoint=ckpt),
                     extra={"preset": args.preset})


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return text.lower() in ("true", "1")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grpo", help="GRPO / Dr. GRPO / DAPO / GSPO on RL prompts with verifiable rewards",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, 'RL prompt JSONL: {"prompt": str | messages, "reward": NAME, "answer": ...}', 1e-5, 50,
                    "constant")
    add_rollout_args(p, 32)
    p.add_argument("--preset", choices=GRPO_PRESETS, default="grpo")
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt G")
    p.add_argument("--num-iterations", type=int, default=1, help="policy updates per rollout batch (mu)")
    p.add_argument("--max-refill-rounds", type=int, default=8, help="DAPO dynamic sampling: max sampling rounds")
    p.add_argument("--pg-loss", choices=PG_LOSS_TYPES, default=None,
                   help="policy-gradient term: REINFORCE (no_baseline), group-mean baseline, grpo, grpo_clip")
    p.add_argument("--scale-rewards", choices=SCALE_REWARDS, default=None, help="'none' = Dr. GRPO")
    p.add_argument("--std-eps", type=float, default=None)
    p.add_argument("--clip-low", type=float, default=None)
    p.add_argument("--clip-high", type=float, default=None, help="DAPO clip-higher (e.g. 0.28)")
    p.add_argument("--importance-level", choices=IMPORTANCE_LEVELS, default=None, help="'sequence' = GSPO")
    p.add_argument("--loss-agg", choices=LOSS_AGGREGATIONS, default=None)
    p.add_argument("--beta", type=float, default=None, help="KL coefficient (0 = no reference model)")
    p.add_argument("--kl-estimator", choices=KL_ESTIMATORS, default=None)
    p.add_argument("--kl-is-correction", type=_bool, default=None, metavar="BOOL")
    p.add_argument("--dynamic-sampling", type=_bool, default=None, metavar="BOOL")
    p.add_argument("--overlong-buffer", type=int, default=None, help="soft overlong punishment L_cache (0 = off)")
    p.add_argument("--overlong-penalty", type=float, default=None)
    p.add_argument("--mask-truncated", type=_bool, default=None, metavar="BOOL",
                   help="DAPO overlong filtering: no loss on completions that hit --max-new-tokens")
    add_lora_args(p)
    p.set_defaults(func=run)
