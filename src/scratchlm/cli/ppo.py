"""`scratchlm ppo`: PPO with a critic on RL prompt JSONL, scored by named verifiable rewards.

    scratchlm ppo --checkpoint runs/sft --data prompts.jsonl --out runs/ppo --reward exact_match \
        --steps 50 --kl-coef 0.05 --ppo-epochs 4
"""

from __future__ import annotations

import argparse

from scratchlm.align.kl import KL_ESTIMATORS
from scratchlm.align.ppo_trainer import PPOTrainConfig, train_ppo
from scratchlm.cli.align_common import add_common_args, add_rollout_args, optim_from_args, rl_prompts, run_align


def run(args: argparse.Namespace) -> int:
    cfg = PPOTrainConfig(
        steps=args.steps, prompts_per_step=args.prompts_per_step, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, ppo_epochs=args.ppo_epochs, micro_batch=args.micro_batch,
        kl_coef=args.kl_coef, kl_estimator=args.kl_estimator, clip_range=args.clip_range,
        clip_range_value=args.clip_range_value, vf_coef=args.vf_coef, gamma=args.gamma, lam=args.lam,
        whiten_rewards=args.whiten_rewards, missing_eos_penalty=args.missing_eos_penalty, dual_clip=args.dual_clip,
        entropy_coef=args.entropy_coef, seed=args.seed,
        optim=optim_from_args(args))
    return run_align(args, rl_prompts(args), cfg,
                     lambda model, tok, data, ckpt: train_ppo(model, tok, data, cfg, checkpoint=ckpt)[0])


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ppo", help="PPO (value head, GAE, clipped losses, KL-shaped reward) on RL prompts",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, 'RL prompt JSONL: {"prompt": str | messages, "reward": NAME, "answer": ...}', 1e-5, 50,
                    "constant")
    add_rollout_args(p, 32)
    d = PPOTrainConfig()
    p.add_argument("--ppo-epochs", type=int, default=d.ppo_epochs)
    p.add_argument("--kl-coef", type=float, default=d.kl_coef, help="per-token KL penalty in the reward")
    p.add_argument("--kl-estimator", choices=KL_ESTIMATORS, default=d.kl_estimator)
    p.add_argument("--clip-range", type=float, default=d.clip_range)
    p.add_argument("--clip-range-value", type=float, default=d.clip_range_value)
    p.add_argument("--vf-coef", type=float, default=d.vf_coef)
    p.add_argument("--gamma", type=float, default=d.gamma)
    p.add_argument("--lam", type=float, default=d.lam)
    p.add_argument("--whiten-rewards", action="store_true")
    p.add_argument("--missing-eos-penalty", type=float, default=None, help="subtracted from truncated completions")
    p.add_argument("--dual-clip", type=float, default=None, help="dual-clip c > 1 for negative advantages")
    p.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus coefficient")
    p.set_defaults(func=run)
