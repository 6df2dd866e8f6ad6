"""Flags and helpers shared by `scratchlm sft|dpo|ppo|grpo`: load the policy, build OptimConfig, save the run.

Every command reads a model (--checkpoint: a scratchlm checkpoint dir, an HF model dir or a .gguf file,
through scratchlm.load.model_loader), trains a copy in place and publishes OUT in one swap (align.run_dir): a
scratchlm checkpoint (loadable by `scratchlm generate --checkpoint OUT`; the model's tokenizer, chat
template and end-of-reply tokens travel with it) — or, for a LoRA run without --merge, the adapter in
PEFT's layout (adapter_config.json + adapter_model.safetensors) with the same tokenizer files — plus
align_config.json and align_history.jsonl, and prints one JSON summary line. While it trains,
OUT/checkpoint is written every --checkpoint-every steps and --resume continues from it bit-identically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import torch

from scratchlm.align.run_state import CheckpointOptions
from scratchlm.align.run_dir import prepare_run_dir, publish_run_dir
from scratchlm.align.trainer_common import OptimConfig, save_run
from scratchlm.model_files import save_model
from scratchlm.cli.outputs import add_overwrite_arg
from scratchlm.align.rewards import REWARDS
from scratchlm.data.align_data import encode_rl_prompts, load_rl_prompts_jsonl
from scratchlm.data.chat_format import chat_format_of
from scratchlm.interop.hf.peft_adapter import check_adapter_family, save_adapter
from scratchlm.load import load_pretrained, write_model_extras
from scratchlm.model import TransformerLM
from scratchlm.nn.lora import LORA_TARGETS, apply_lora, merge_lora
from scratchlm.train.distributed import pick_device
from scratchlm.train.precision import PRECISIONS
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
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="bf16-mixed: forwards/backwards under bf16 autocast, fp32 master weights and AdamW state "
                        "(fast on GPUs and CPUs with AVX512-BF16/AMX; slow on AVX2-only CPUs)")
    p.add_argument("--fast", action="store_true",
                   help="the tested fast paths: torch's SDPA attention and fused norm/SiLU/RoPE kernels, torch's "
                        "fused AdamW, and (sft) the LM head fused with the loss over chunks of positions")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each block in the backward: less memory, about a third more compute")
    p.add_argument("--checkpoint-every", type=int, default=50, metavar="N",
                   help="write OUT/checkpoint every N steps (0 = never); --resume continues from it")
    p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out (same flags)")
    add_overwrite_arg(p)


def add_lora_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora-r", type=int, default=0, metavar="R", help="train LoRA adapters of rank R (0 = full)")
    p.add_argument("--lora-alpha", type=float, default=None, help="LoRA scale alpha (default 2 R): W + alpha/R BA")
    p.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the adapter input")
    p.add_argument("--lora-targets", default="q_proj,v_proj", metavar="NAMES",
                   help=f"comma-separated layers to adapt, from {','.join(LORA_TARGETS)}")
    p.add_argument("--merge", action="store_true",
                   help="LoRA: write the merged plain checkpoint instead of the PEFT adapter")


def add_rollout_args(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    p.add_argument("--reward", default=None, help="reward function for prompt lines that name none (see docs/post-training.md)")
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="completion cap L_max")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling AND scoring temperature (> 0)")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=64, help="rows per forward/backward")


def optim_from_args(args: argparse.Namespace) -> OptimConfig:
    return OptimConfig(lr=args.lr, weight_decay=args.weight_decay, warmup_steps=args.warmup_steps,
                       schedule=args.schedule, grad_clip=args.grad_clip, precision=args.precision,
                       optimizer_impl="torch" if args.fast else "reference")


def load_policy(args: argparse.Namespace) -> tuple[TransformerLM, Any]:
    """(model in train mode, tokenizer) from --checkpoint, with LoRA adapters when --lora-r > 0; sets
    --threads and the seed.

    The whole LoadedModel is kept as args.loaded so `finish` writes its chat template and stop tokens."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # LoRA: a GGUF base stays in its ggml blocks (QLoRA, frozen); full fine-tuning needs a dense fp32 copy
    lora = bool(getattr(args, "lora_r", 0))
    fast = {"attn_impl": "sdpa", "ops_impl": "fused"} if getattr(args, "fast", False) else {}
    args.loaded = load_pretrained(args.checkpoint, dtype=None if lora else torch.float32, keep_quantized=False,
                                  **fast)
    model = args.loaded.model.to(pick_device(args.device)).train()
    model.activation_checkpointing = bool(getattr(args, "activation_checkpointing", False))
    if getattr(args, "lora_r", 0):
        targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
        alpha = 2.0 * args.lora_r if args.lora_alpha is None else args.lora_alpha
        apply_lora(model, targets, args.lora_r, alpha, args.lora_dropout)
        if not args.merge:
            check_adapter_family(model)  # before training: the adapter must be writable at the end
    elif getattr(args, "merge", False):
        raise ValueError("--merge folds LoRA adapters into the weights; it needs --lora-r > 0")
    return model, args.loaded.tokenizer


def prepare_output(args: argparse.Namespace) -> Path | None:
    """Check and claim --out before any work (align.run_dir.prepare_run_dir)."""
    if args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    return prepare_run_dir(args.out, args.checkpoint, args.resume, args.overwrite)


def checkpoint_options(args: argparse.Namespace) -> CheckpointOptions:
    return CheckpointOptions(args.out, args.checkpoint_every, args.resume)


def reward_summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """Mean sampled reward over the first and the last fifth of the RL steps."""
    k = max(1, len(history) // 5)
    return {"reward_first_steps": sum(h["reward"] for h in history[:k]) / k,
            "reward_last_steps": sum(h["reward"] for h in history[-k:]) / k}


def write_model(model: TransformerLM, directory: Path, args: argparse.Namespace) -> None:
    """The trained model: a plain checkpoint, or for LoRA the PEFT adapter (merged into weights with --merge)."""
    if not getattr(args, "lora_r", 0):
        save_model(model, directory)
    elif args.merge:
        save_model(merge_lora(model), directory)
    else:
        save_adapter(model, directory, base_model=str(Path(args.checkpoint).resolve()))


def finish(model: TransformerLM, tok: Any, args: argparse.Namespace, cfg: Any, history: list[dict[str, Any]],
           summary: dict[str, Any], replaced: Path | None = None) -> int:
    """Publish the run to --out in one swap and print the JSON summary."""
    config = {"command": args.command, "checkpoint": str(args.checkpoint), "data": str(args.data),
              "config": dataclasses.asdict(cfg)}
    if getattr(args, "lora_r", 0):
        config["lora"] = {"r": args.lora_r, "alpha": 2.0 * args.lora_r if args.lora_alpha is None else args.lora_alpha,
                          "dropout": args.lora_dropout, "targets": args.lora_targets, "merged": args.merge}

    def fill(tmp: Path) -> None:
        write_model(model, tmp, args)
        save_run(tmp, tok, config, history)
        if getattr(args, "loaded", None) is not None:
            write_model_extras(args.loaded, tmp)

    out = publish_run_dir(args.out, fill, replaced)
    print(json.dumps({"out": str(out), "steps": len(history), **summary}))
    return 0


def rl_prompts(args: argparse.Namespace) -> Callable[[Any, Any], list[Any]]:
    """encode(tok, fmt) of --data as RL prompts, each with a known reward function (--reward by default)."""
    return lambda tok, fmt: encode_rl_prompts(tok, load_rl_prompts_jsonl(args.data, args.reward, REWARDS), fmt)


def run_align(args: argparse.Namespace, encode: Callable[[Any, Any], Any], config: Any,
              train: Callable[..., list[dict[str, Any]]], measure: tuple[str, Callable] | None = None,
              extra: dict[str, Any] | None = None) -> int:
    """The run of every post-training command: claim --out, load the policy, encode --data with the model's
    chat format (encode(tok, fmt)), train(model, tok, data, checkpoint) -> history, publish OUT.

    measure = (name, fn(model, data) -> float): reported before and after training as NAME_start /
    NAME_end; without it, the RL reward summary of the history. extra: more summary fields."""
    replaced = prepare_output(args)
    model, tok = load_policy(args)
    data = encode(tok, chat_format_of(args.loaded))
    before = measure[1](model, data) if measure else None
    history = train(model, tok, data, checkpoint_options(args))
    if measure:
        summary = {f"{measure[0]}_start": before, f"{measure[0]}_end": measure[1](model, data)}
    else:
        summary = reward_summary(history)
    return finish(model, tok, args, config, history, {**(extra or {}), **summary}, replaced)
