"""Reasoning-RL demo on 2 CPU cores: pretrain -> SFT -> GRPO with the math grader -> held-out accuracy.

Everything is generated here and trained by scratchlm (align/word_problems.py: two-number addition word
problems, worked digit by digit):
  1. pretraining text (scratchlm.train): "Q: <story>\\nA: 7+8=15, carry 1. 4+3+1=8. The answer is 85."
  2. SFT (`scratchlm sft`, chat JSONL): user = the story, assistant = "<think>...</think> <answer>85</answer>"
  3. GRPO (`scratchlm grpo --reward math`): chat prompts of training pairs, G completions each
  4. `scratchlm eval --task accuracy --grader math` on HELD-OUT (a, b) pairs, greedy, for SFT and GRPO
The human-written data (pretraining and SFT alike) drops the carry in --slip of the carry problems (the
classic mistake), so imitation learns it; the only signal that tells it apart is the verifiable reward.
Prints ONE JSON object (stage times, eval summaries with 95% intervals, the gain with its two-proportion
z-test and the paired McNemar test on the same problems) and writes the curves (pretraining loss, SFT
loss, GRPO reward, held-out accuracy) to --png. Default settings: about 8 minutes on 2 cores.

    flock /work/heavy.lock env PYTHONPATH=src .venv/bin/python benchmarks/reasoning_rl.py --png benchmarks/reasoning_rl.png
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from scratchlm.align.toy_task import byte_tokenizer
from scratchlm.align.word_problems import plain_solution, reasoning_solution, sample_problems, split_pairs
from scratchlm.cli.main import main as cli
from scratchlm.data.token_file import write_token_file
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe
from scratchlm.train.train_config import TrainConfig
from scratchlm.train.loop import train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quiet import wait_quiet  # noqa: E402

MODEL = {"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 256,
         "ops_impl": "fused", "attn_impl": "sdpa"}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_tokenizer(work: Path, docs: list[str], args: argparse.Namespace) -> Tokenizer:
    """scratchlm's byte-level BPE trained on a sample of the pretraining text (digits group as GPT-2's
    pre-tokenizer groups them, so most 2-digit numbers become one token), or plain bytes (--vocab-size 0)."""
    if args.vocab_size == 0:
        return byte_tokenizer()
    sample = work / "bpe_sample.txt"
    sample.write_text("\n".join(docs[:4000]) + "\n" + "\n".join(
        reasoning_solution(p) for p in sample_problems(split_pairs(args.test_size, args.seed)[0], 2000,
                                                       random.Random(args.seed + 1))))
    vocab, merges = train_bpe(sample, args.vocab_size, list(DEFAULT_SPECIAL_TOKENS))
    return Tokenizer(vocab, merges, list(DEFAULT_SPECIAL_TOKENS))


def build_data(work: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Tokenizer, pretraining tokens, SFT chat JSONL, RL prompts (training pairs), held-out test prompts."""
    rng = random.Random(args.seed)
    train_pairs, test_pairs = split_pairs(args.test_size, args.seed)
    slip = lambda p: p.carries and rng.random() < args.slip  # noqa: E731
    docs = [f"Q: {p.question}\nA: {plain_solution(p, slip(p))}"
            for p in sample_problems(train_pairs, args.pretrain_docs, rng)]
    tok = make_tokenizer(work, docs, args)
    tok.save(work / "tokenizer")
    eot = tok.special_token_ids["<|endoftext|>"]
    write_token_file(work / "pretrain.bin", ([*tok.encode(d), eot] for d in docs), tok.vocab_size)
    sft = [{"messages": [{"role": "user", "content": p.question},
                         {"role": "assistant", "content": reasoning_solution(p, slip(p))}]}
           for p in sample_problems(train_pairs, args.sft_examples, rng)]
    rl = [{"prompt": [{"role": "user", "content": p.question}], "answer": str(p.answer)}
          for p in sample_problems(train_pairs, args.rl_prompts, rng)]
    test = [{"prompt": [{"role": "user", "content": p.question}], "answer": str(p.answer)}
            for p in (sample_problems([pair], 1, rng)[0] for pair in test_pairs)]
    return {"tokens": work / "pretrain.bin", "sft": write_jsonl(work / "sft.jsonl", sft),
            "rl": write_jsonl(work / "rl.jsonl", rl), "test": write_jsonl(work / "test.jsonl", test),
            "tokenizer": work / "tokenizer"}


def pretrain(work: Path, data: dict[str, Path], args: argparse.Namespace) -> Path:
    cfg = TrainConfig(model_preset="llama-tiny", model=dict(MODEL, vocab_size=Tokenizer.load(data["tokenizer"]).vocab_size),
                      train_data=str(data["tokens"]), val_fraction=0.02,
                      tokenizer_dir=str(data["tokenizer"]), out_dir=str(work / "pretrain"), batch_size=args.batch,
                      seq_len=args.seq_len, max_steps=args.pretrain_steps, lr=args.lr, min_lr=args.lr / 10, warmup_steps=min(30, args.pretrain_steps),
                      weight_decay=0.1, eval_interval=args.pretrain_steps, eval_batches=4,
                      ckpt_interval=args.pretrain_steps, log_interval=10, num_threads=args.threads, seed=args.seed,
                      progress=False)
    return train(cfg).checkpoint


def run_cli(argv: list[str]) -> dict:
    """Run a scratchlm command in-process; returns the JSON line it printed last."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(argv)
    if rc != 0:
        raise RuntimeError(f"scratchlm {' '.join(argv[:1])} failed with exit status {rc}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def evaluate(checkpoint: Path, test: Path, args: argparse.Namespace, out: Path) -> dict:
    return run_cli(["eval", "--checkpoint", str(checkpoint), "--task", "accuracy", "--data", str(test),
                    "--grader", "math", "--max-new-tokens", "40", "--batch-size", "100", "--threads",
                    str(args.threads), "--no-progress", "--out", str(out)])


def two_proportion_z(p1: float, p2: float, n: int) -> tuple[float, float]:
    """z and the two-sided p-value of p2 - p1 for two independent samples of size n (pooled)."""
    pooled = (p1 + p2) / 2
    se = math.sqrt(2 * pooled * (1 - pooled) / n) or 1e-12
    z = (p2 - p1) / se
    return z, math.erfc(abs(z) / math.sqrt(2))


def mcnemar(sft_items: list[dict], grpo_items: list[dict]) -> dict:
    """Paired test on the same problems: b = right only after SFT, c = right only after GRPO;
    z = (c - b) / sqrt(b + c) (McNemar, normal approximation) and its two-sided p-value."""
    b = sum(s["correct"][0] and not g["correct"][0] for s, g in zip(sft_items, grpo_items))
    c = sum(g["correct"][0] and not s["correct"][0] for s, g in zip(sft_items, grpo_items))
    z = (c - b) / math.sqrt(b + c) if b + c else 0.0
    return {"only_sft_right": b, "only_grpo_right": c, "z": round(z, 2), "p_value": math.erfc(abs(z) / math.sqrt(2))}


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(work: Path, results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    pre = [r for r in _read_jsonl(work / "pretrain" / "metrics.jsonl") if "loss" in r]
    axes[0].plot([r["step"] for r in pre], [r["loss"] for r in pre])
    axes[0].set(title="1. pretraining (text)", xlabel="step", ylabel="loss (nats/token)")
    sft = _read_jsonl(work / "sft" / "align_history.jsonl")
    axes[1].plot([r["step"] for r in sft], [r["loss"] for r in sft])
    axes[1].set(title="2. SFT (assistant tokens)", xlabel="step", ylabel="loss")
    grpo = _read_jsonl(work / "grpo" / "align_history.jsonl")
    rewards = [r["reward"] for r in grpo]
    smooth = [sum(rewards[max(0, i - 9):i + 1]) / len(rewards[max(0, i - 9):i + 1]) for i in range(len(rewards))]
    axes[2].plot(rewards, alpha=0.3, label="per step")
    axes[2].plot(smooth, label="10-step mean")
    axes[2].set(title="3. GRPO: sampled reward (math grader)", xlabel="rollout step", ylabel="mean reward")
    axes[2].legend()
    names = ["SFT", "GRPO"]
    acc = [results["eval"]["sft"]["pass@1"], results["eval"]["grpo"]["pass@1"]]
    ci = [results["eval"]["sft"]["pass@1_ci95"], results["eval"]["grpo"]["pass@1_ci95"]]
    axes[3].bar(names, acc, yerr=[[max(0.0, a - c[0]) for a, c in zip(acc, ci)],
                                  [max(0.0, c[1] - a) for a, c in zip(acc, ci)]],
                capsize=6, color=["tab:gray", "tab:green"])
    axes[3].set(title=f"4. held-out accuracy\n(greedy, n={results['test_size']}, 95% CI)", ylim=(0, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def stage(name: str, times: dict, fn, *a):
    t0 = time.perf_counter()
    out = fn(*a)
    times[name] = round(time.perf_counter() - t0, 1)
    print(f"[reasoning_rl] {name}: {times[name]} s", file=sys.stderr)
    return out


def run(args: argparse.Namespace, work: Path) -> dict:
    torch.set_num_threads(args.threads)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    data = stage("data", times, build_data, work, args)
    ckpt = stage("pretrain", times, pretrain, work, data, args)
    common = ["--threads", str(args.threads), "--checkpoint-every", "0", "--seed", str(args.seed)]
    stage("sft", times, run_cli, ["sft", "--checkpoint", str(ckpt), "--data", str(data["sft"]), "--out",
                                  str(work / "sft"), "--steps", str(args.sft_steps), "--batch-size", "32",
                                  "--lr", "1e-3", "--warmup-steps", "10", *common])
    sft_eval = stage("eval_sft", times, evaluate, work / "sft", data["test"], args, work / "eval_sft.json")
    grpo = stage("grpo", times, run_cli, [
        "grpo", "--checkpoint", str(work / "sft"), "--data", str(data["rl"]), "--out", str(work / "grpo"),
        "--reward", "math", "--steps", str(args.grpo_steps), "--group-size", "8", "--prompts-per-step", "8",
        "--max-new-tokens", "40", "--lr", str(args.grpo_lr), "--warmup-steps", "10", "--beta", "0",
        "--micro-batch", "64", *common])
    grpo_eval = stage("eval_grpo", times, evaluate, work / "grpo", data["test"], args, work / "eval_grpo.json")
    keys = ("pass@1", "pass@1_ci95", "problems")
    gain = grpo_eval["pass@1"] - sft_eval["pass@1"]
    z, p = two_proportion_z(sft_eval["pass@1"], grpo_eval["pass@1"], args.test_size)
    return {"benchmark": "reasoning_rl", "test_size": args.test_size, "slip": args.slip, "times_s": times,
            "total_s": round(time.perf_counter() - t0, 1),
            "eval": {"sft": {k: sft_eval[k] for k in keys}, "grpo": {k: grpo_eval[k] for k in keys}},
            "gain": round(gain, 4), "z": round(z, 2), "p_value": p,
            "paired": mcnemar(json.loads((work / "eval_sft.json").read_text())["items"],
                              json.loads((work / "eval_grpo.json").read_text())["items"]),
            "grpo_reward_first_last": [round(grpo["reward_first_steps"], 3), round(grpo["reward_last_steps"], 3)],
            "settings": {k: v for k, v in vars(args).items() if k not in ("png", "work")},
            "machine": platform.processor() or platform.machine(), "torch": torch.__version__}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slip", type=float, default=0.6, help="share of carry problems whose human solution drops it")
    p.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary (0 = bytes, 259 tokens)")
    p.add_argument("--pretrain-docs", type=int, default=20000)
    p.add_argument("--pretrain-steps", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=64, help="pretraining window (tokens)")
    p.add_argument("--batch", type=int, default=32, help="pretraining batch (windows)")
    p.add_argument("--lr", type=float, default=3e-3, help="pretraining peak learning rate")
    p.add_argument("--sft-examples", type=int, default=1000)
    p.add_argument("--sft-steps", type=int, default=250)
    p.add_argument("--rl-prompts", type=int, default=2000)
    p.add_argument("--grpo-steps", type=int, default=150)
    p.add_argument("--grpo-lr", type=float, default=3e-5)
    p.add_argument("--test-size", type=int, default=500)
    p.add_argument("--png", default="benchmarks/reasoning_rl.png")
    p.add_argument("--work", default=None, help="keep the run's files here (default: a temp dir)")
    p.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    return p.parse_args()


def main() -> None:
    args = parse()
    if not args.no_wait:
        wait_quiet()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = run(args, work)
        plot(work, results, args.png)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
