"""`scratchlm eval`: perplexity, accuracy of generated answers (graded, pass@k), or multiple choice.

    scratchlm eval --checkpoint runs/sft --task perplexity --data valid.jsonl [--seq-len 512 --stride 256]
    scratchlm eval --checkpoint runs/grpo --task accuracy --data test.jsonl --grader math \\
        [--samples 8 --k 1,4,8 --temperature 0.8 --max-new-tokens 256]
    scratchlm eval --checkpoint runs/sft --task choice --data mmlu.jsonl
--checkpoint takes a scratchlm checkpoint dir, an HF dir, a .gguf file or a LoRA adapter dir (its base
model with the adapter merged). Prints a short table on stderr and one JSON summary line on stdout;
--out FILE also writes every item (completions, grades, option log-likelihoods) as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from scratchlm.align.rewards import REWARDS, get_reward
from scratchlm.cli.generate import DTYPES
from scratchlm.cli.outputs import add_output_arg
from scratchlm.data.align_data import encode_rl_prompts
from scratchlm.data.chat_format import chat_format_of
from scratchlm.eval.accuracy import check_sampling, evaluate_accuracy
from scratchlm.eval.choice import evaluate_choices
from scratchlm.eval.data import load_choice_items, load_problems, load_texts
from scratchlm.eval.perplexity import text_perplexity
from scratchlm.eval.report import summary_table
from scratchlm.load import load_pretrained
from scratchlm.io_utils import atomic_output_file
from scratchlm.train.distributed import pick_device

TASKS = ("perplexity", "accuracy", "choice")


def _ks(text: str) -> list[int]:
    try:
        return sorted({int(k) for k in text.split(",") if k.strip()})
    except ValueError:
        raise ValueError(f"--k must be comma-separated integers such as 1,4,8, got {text!r}") from None


def _limit(items: list, n: int | None) -> list:
    return items if n is None else items[:n]


def run_task(args: argparse.Namespace, loaded: Any) -> dict[str, Any]:
    """The chosen task's {"summary", "items"?} on the loaded model."""
    model, tok, progress = loaded.model, loaded.tokenizer, not args.no_progress
    if args.task == "perplexity":
        window = args.seq_len or model.config.max_seq_len
        if window > model.config.max_seq_len:
            raise ValueError(f"--seq-len {window} exceeds the model's context max_seq_len={model.config.max_seq_len}")
        texts = _limit(load_texts(args.data), args.limit)
        return {"summary": text_perplexity(model, tok, texts, window, args.stride, loaded.bos_token_id,
                                           args.batch_size, progress)}
    fmt = chat_format_of(loaded)
    if args.task == "choice":
        return evaluate_choices(model, tok, _limit(load_choice_items(args.data), args.limit), args.batch_size, fmt,
                                progress)
    ks = _ks(args.k)
    check_sampling(args.samples, ks, args.temperature)
    problems = encode_rl_prompts(tok, _limit(load_problems(args.data), args.limit), fmt)
    return evaluate_accuracy(model, tok, problems, get_reward(args.grader), args.samples, ks, args.max_new_tokens,
                             args.temperature, args.top_p, args.seed, args.batch_size, loaded.stop_token_ids,
                             progress)


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    loaded = load_pretrained(args.checkpoint, keep_quantized=False, dtype=DTYPES[args.dtype])
    loaded.model = loaded.model.to(pick_device(args.device)).eval()
    result = run_task(args, loaded)
    header = {"task": args.task, "checkpoint": str(args.checkpoint), "data": str(args.data)}
    if args.task == "accuracy":
        header.update(grader=args.grader, temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    summary = {**header, **result["summary"]}
    print(summary_table(args.task, result["summary"]), file=sys.stderr)
    if args.out:
        with atomic_output_file(args.out, args.overwrite, "--out", mode="w") as f:
            json.dump({**header, "summary": result["summary"], "items": result.get("items", [])}, f, indent=1,
                      default=str)
    print(json.dumps(summary))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="perplexity, graded accuracy (pass@k) or multiple choice of a model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="scratchlm checkpoint dir, HF dir, .gguf file or LoRA adapter dir")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--data", required=True, metavar="FILE",
                   help="perplexity: .jsonl of {text} or a text file; accuracy: {prompt, answer}; "
                        "choice: {prompt, choices, answer}")
    add_output_arg(p, "--out", kind="file", default=None, metavar="FILE.json", help="write every item as JSON")
    p.add_argument("--batch-size", type=int, default=16, help="rows per forward / generation batch")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N items")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="weights: auto = as stored (a .gguf evaluates on its own quantized blocks; other models fp32; "
                        "default); fp32 / bf16 = a dense copy (log-probs in fp32)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("perplexity")
    g.add_argument("--seq-len", type=int, default=None, help="window length (default: the model's context)")
    g.add_argument("--stride", type=int, default=None, help="window start step (default: --seq-len)")
    g = p.add_argument_group("accuracy")
    g.add_argument("--grader", default="math", choices=sorted(REWARDS), help="reward function that grades a sample")
    g.add_argument("--samples", type=int, default=1, help="completions per problem n")
    g.add_argument("--k", default="1", help="comma-separated k for pass@k (each <= --samples)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)
