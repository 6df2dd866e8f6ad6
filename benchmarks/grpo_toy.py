"""GRPO-family toy demonstration: reward curves of GRPO / Dr. GRPO / DAPO / GSPO (and PPO) on small additions.

A byte-tokenizer Llama-style model (2 layers, D 64, 115k parameters) is pretrained briefly on "a+b=c"
(a, b in 0..4, 120 supervised steps: it has half-learned the table), then each setting starts from a
copy of that model and trains for --steps rollout steps (GRPO family: 8 prompts x G 8 completions;
PPO: 64 prompts x 1 completion, 2 epochs; temperature 1, lr 3e-3 with 10 warm-up steps).
The reward is exact_match on the answer; the curves plot the mean reward of 16 samples per prompt over
all 25 prompts, measured every --eval-every steps. Prints ONE JSON object:
    {"results": [{"setting", "reward_start", "reward_end", "seconds", ...}, ...], ...}
and writes the curves to --png.

    .venv/bin/python benchmarks/grpo_toy.py --steps 150 --png benchmarks/grpo_toy.png
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time

import torch

from scratchlm.align.grpo import preset
from scratchlm.align.grpo_trainer import GRPOTrainConfig, train_grpo
from scratchlm.align.ppo_trainer import PPOTrainConfig, train_ppo
from scratchlm.align.toy_task import addition_prompts, byte_tokenizer, mean_reward, supervised_warmup, toy_model_config
from scratchlm.align.trainer_common import OptimConfig
from scratchlm.model import TransformerLM
from scratchlm.viz.save import save_figure

SETTINGS = {
    "grpo": dict(loss=lambda: preset("grpo")),  # paper: seq-mean-token-mean, std, beta 0.04 k3
    "dr_grpo": dict(loss=lambda: preset("dr_grpo", max_completion_length=4)),
    "dapo": dict(loss=lambda: preset("dapo")),  # clip 0.2/0.28, token-mean, dynamic sampling, beta 0
    "gspo": dict(loss=lambda: preset("gspo")),  # sequence ratio, clip 3e-4/4e-4, beta 0
}


def run_setting(name: str, warm: TransformerLM, tok, ex, args) -> dict:
    model = copy.deepcopy(warm)
    curve = [(0, mean_reward(model, tok, ex, samples=16))]

    def on_step(record: dict) -> None:
        step = record["step"] + 1
        if step % args.eval_every == 0 or step == args.steps:
            curve.append((step, mean_reward(model, tok, ex, samples=16)))

    t0 = time.perf_counter()
    optim = OptimConfig(lr=args.lr, warmup_steps=10)
    if name == "ppo":
        cfg = PPOTrainConfig(steps=args.steps, prompts_per_step=64, max_new_tokens=4, ppo_epochs=2, micro_batch=64,
                             kl_coef=0.01, optim=optim)
        history, _ = train_ppo(model, tok, ex, cfg, progress=False, on_step=on_step)
    else:
        cfg = GRPOTrainConfig(steps=args.steps, prompts_per_step=8, group_size=8, max_new_tokens=4, seed=args.seed,
                              loss=SETTINGS[name]["loss"](), optim=optim)
        history = train_grpo(model, tok, ex, cfg, progress=False, on_step=on_step)
    seconds = time.perf_counter() - t0
    out = {"setting": name, "reward_start": round(curve[0][1], 4), "reward_end": round(curve[-1][1], 4),
           "seconds": round(seconds, 1), "curve": [[s, round(r, 4)] for s, r in curve]}
    if name != "ppo":
        out["clip_frac_last"] = round(history[-1].get("clip_low_frac", 0) + history[-1].get("clip_high_frac", 0), 4)
        out["rounds_total"] = sum(h["rounds"] for h in history)
    return out


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        ax.plot(*zip(*r["curve"]), "o-", markersize=3, label=r["setting"])
    ax.set_xlabel("rollout step")
    ax.set_ylabel("mean exact-match reward (16 samples x 25 prompts, T=1)")
    ax.set_title("scratchlm: GRPO family on toy additions")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settings", default="grpo,dr_grpo,dapo,gspo,ppo")
    p.add_argument("--threads", type=int, default=1, help="tiny model: 1 thread is fastest on a shared box")
    p.add_argument("--png", default="benchmarks/grpo_toy.png")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok, ex = byte_tokenizer(), addition_prompts(4)
    warm = TransformerLM(toy_model_config(tok.vocab_size))
    t0 = time.perf_counter()
    supervised_warmup(warm, tok, ex, steps=120, p_correct=1.0, lr=1e-2, batch_size=32, seed=args.seed)
    warm_s = time.perf_counter() - t0
    results = [run_setting(name, warm, tok, ex, args) for name in args.settings.split(",")]
    plot(results, args.png)
    print(json.dumps({"task": "a+b= (a, b in 0..4), exact_match", "steps": args.steps, "warmup_s": round(warm_s, 1),
                      "params": sum(p.numel() for p in warm.parameters()), "torch": torch.__version__,
                      "threads": args.threads, "machine": platform.processor() or platform.machine(),
                      "png": args.png, "results": results}))


if __name__ == "__main__":
    main()
