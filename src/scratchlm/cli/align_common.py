"""Flags and helpers shared by `scratchlm sft|dpo|ppo|grpo`: load the policy, build OptimConfig, save the run.

Every command reads a model (--checkpoint: a scratchlm checkpoint dir, an HF model dir or a .gguf file,
through scratchlm.loading), trains a copy in place, writes OUT as a scratchlm checkpoint (loadable by
`scratchlm generate --checkpoint OUT`; the model's tokenizer, chat template and end-of-reply tokens travel
with it) plus align_config.json and align_history.jsonl, and prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from scratchlm.align.trainer_common import OptimConfig, save_run
from scratchlm.loading import load_pretrained, write_model_extras
from scratchlm.model import TransformerLM
from scratchlm.train.distributed import pick_device
from scratchlm.train.schedule import SCHEDULES


def add_common_args(p: argparse.ArgumentParser, data_help: str, lr: float, steps: int, schedule: str) -> None:
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="starting model: a scratchlm checkpoint dir, an HF model dir or a .gguf file")
    p.add_argument("--data", required=True, metavar="FILE.jsonl", help=data_help)
    p.add_argument("--out", required=True, metavar="DIR", help="where the trained model is written")
    p.add_argument("--steps", type=int, default=steps, help="optimizer steps (RL: rollout steps)")
    p.add_argument("--lr", type=float, default=lr, help="peak learning rate (AdamW)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--schedule", choices=SCHEDULES, default=schedule)
    p.add_argument("--grad-clip", type=float, default=1.0, help="global gradient-norm clip")
    p.add_argument("--seed", type=int, default=0, help="seeds data order, sampling and init of new heads")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto = cuda when available")


def add_rollout_args(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    p.add_argument("--reward", default=None, help="reward function for prompt lines that name none (see README)")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="completion cap L_max")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling AND scoring temperature (> 0)")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=64, help="rows per forward/backward")


def optim_from_args(args: argparse.Namespace) -> OptimConfig:
    return OptimConfig(lr=args.lr, weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
                       schedule=args.schedule, grad_clip=args.grad_clip)


def load_policy(args: argparse.Namespace) -> tuple[TransformerLM, Any]:
    """(model in train mode, tokenizer) from --checkpoint; sets --threads and the seed.

    The whole LoadedModel is kept as args.loaded so `finish` writes its chat template and stop tokens."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.loaded = load_pretrained(args.checkpoint, keep_quantized=False)  # fine-tuning outdates ggml blocks
    model = args.loaded.model.to(pick_device(args.device)).train()
    return model, args.loaded.tokenizer


def reward_summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean sampled reward over the first and the last fifth of the RL steps."""
    k = max(1, len(history) // 5)
    return {"reward_first_steps": sum(h["reward"] for h in history[:k]) / k,
            "reward_last_steps": sum(h["reward"] for h in history[-k:]) / k}


def finish(model: TransformerLM, tok: Any, args: argparse.Namespace, cfg: Any, history: list[dict[str, Any]],
           summary: dict[str, Any]) -> int:
    """Save the run to --out and print the JSON summary."""
    config = {"command": args.command, "checkpoint": str(args.checkpoint), "data": str(args.data),
              "config": dataclasses.asdict(cfg)}
    out = save_run(model, Path(args.out), tok, config, history)
    if getattr(args, "loaded", None) is not None:
        write_model_extras(args.loaded, out)
    print(json.dumps({"out": str(out), "steps": len(history), **summary}))
    return 0
