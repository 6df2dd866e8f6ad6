"""GRPO-family toy demonstration: reward curves of GRPO / Dr. GRPO / DAPO / GSPO (and PPO) on small additions.

For each seed, a byte-tokenizer Llama-style model (2 layers, D 64, 115k parameters) is pretrained briefly on
"a+b=c" (a, b in 0..4) until it has half-learned the table: supervised steps at lr 3e-3 until its mean sampled
reward reaches --warmup-target (0.45; checked every 10 steps on samples of their own), at most
--warmup-steps. (--warmup-target 0 --warmup-steps 120 --warmup-lr 1e-2 is the first protocol: a fixed 120
steps, which half-taught seed 0 but left seeds 1 and 2 ignoring the prompt and seeds 3 and 5 near the
ceiling; align/toy_task.py.) Each setting then starts from a copy of that model and trains for --steps
rollout steps (GRPO family: 8 prompts x G 8 completions; PPO: 64 prompts x 1 completion, 2 epochs;
temperature 1, lr --lr = 1e-3 with 10 warm-up steps; the first protocol's 3e-3 makes the GRPO-family
curves swing by 0.2-0.4 between evaluations). The reward is exact_match on the answer; the curves plot
the mean reward of 16 samples per prompt over all 25 prompts, measured every --eval-every steps.
One run of 150 steps is chaotic (from the same starting model, last-bit differences in the forward pass
moved GSPO's end reward from 0.77 to 0.70), so the summary is over --seeds. Prints ONE JSON object:
    {"summary": {setting: {"gain_mean", "gain_sd", "gains", ...}}, "results": [{"seed", "setting",
     "reward_start", "reward_end", "clip_frac_max", ...}, ...], ...}
and writes the seed-mean curves to --png.

    .venv/bin/python benchmarks/grpo_toy.py --steps 150 --png benchmarks/grpo_toy.png
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
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


def run_setting(name: str, warm: TransformerLM, tok, ex, args, seed: int) -> dict:
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
                             kl_coef=0.01, seed=seed, optim=optim)
        history, _ = train_ppo(model, tok, ex, cfg, progress=False, on_step=on_step)
    else:
        cfg = GRPOTrainConfig(steps=args.steps, prompts_per_step=8, group_size=8, max_new_tokens=4, seed=seed,
                              loss=SETTINGS[name]["loss"](), optim=optim)
        history = train_grpo(model, tok, ex, cfg, progress=False, on_step=on_step)
    seconds = time.perf_counter() - t0
    out = {"seed": seed, "setting": name, "reward_start": round(curve[0][1], 4), "reward_end": round(curve[-1][1], 4),
           "gain": round(curve[-1][1] - curve[0][1], 4), "seconds": round(seconds, 1),
           "curve": [[s, round(r, 4)] for s, r in curve]}
    if name != "ppo":  # mu = 1: the ratio is exactly 1, so nothing may be clipped at any step
        out["clip_frac_max"] = max(h.get("clip_low_frac", 0) + h.get("clip_high_frac", 0) for h in history)
        out["rounds_total"] = sum(h["rounds"] for h in history)
    return out


def summarize(results: list[dict]) -> dict:
    """Per setting: the gains (end - start reward) of every seed, their mean and sample sd, mean start/end."""
    out = {}
    for name in dict.fromkeys(r["setting"] for r in results):
        rs = [r for r in results if r["setting"] == name]
        gains = [r["gain"] for r in rs]
        out[name] = {"gain_mean": round(statistics.fmean(gains), 4),
                     "gain_sd": round(statistics.stdev(gains), 4) if len(gains) > 1 else None,
                     "gains": gains, "seeds": [r["seed"] for r in rs],
                     "reward_start_mean": round(statistics.fmean(r["reward_start"] for r in rs), 4),
                     "reward_end_mean": round(statistics.fmean(r["reward_end"] for r in rs), 4)}
        if "clip_frac_max" in rs[0]:
            out[name]["clip_frac_max"] = max(r["clip_frac_max"] for r in rs)
    return out


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    seeds = sorted({r["seed"] for r in results})
    for name in dict.fromkeys(r["setting"] for r in results):
        curves = [r["curve"] for r in results if r["setting"] == name]
        steps = [s for s, _ in curves[0]]
        mean = [statistics.fmean(c[i][1] for c in curves) for i in range(len(steps))]
        ax.plot(steps, mean, "o-", markersize=3, label=name)
    ax.set_xlabel("rollout step")
    ax.set_ylabel("mean exact-match reward (16 samples x 25 prompts, T=1)")
    ax.set_title(f"scratchlm: GRPO family on toy additions (mean of seeds {', '.join(map(str, seeds))})")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=110)


def warm_model(tok, ex, seed: int, args) -> tuple[TransformerLM, int]:
    """The seed's starting policy (module docstring) and its number of supervised steps."""
    torch.manual_seed(seed)
    warm = TransformerLM(toy_model_config(tok.vocab_size))
    losses = supervised_warmup(warm, tok, ex, steps=args.warmup_steps, p_correct=1.0, lr=args.warmup_lr,
                               batch_size=32, seed=seed, stop_at_reward=args.warmup_target or None)
    return warm, len(losses)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--lr", type=float, default=1e-3, help="RL learning rate (the first protocol: 3e-3)")
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds; the summary is over them")
    p.add_argument("--seed", type=int, default=None, help="one seed only (same as --seeds N)")
    p.add_argument("--warmup-target", type=float, default=0.45,
                   help="stop the supervised warm-up at this mean sampled reward (0 = run --warmup-steps)")
    p.add_argument("--warmup-steps", type=int, default=400)
    p.add_argument("--warmup-lr", type=float, default=3e-3)
    p.add_argument("--settings", default="grpo,dr_grpo,dapo,gspo,ppo")
    p.add_argument("--threads", type=int, default=1, help="tiny model: 1 thread is fastest on a shared box")
    p.add_argument("--png", default="benchmarks/grpo_toy.png")
    args = p.parse_args()
    seeds = [args.seed] if args.seed is not None else [int(s) for s in args.seeds.split(",")]
    bad = sorted(set(args.settings.split(",")) - {*SETTINGS, "ppo"})
    if bad:
        raise SystemExit(f"unknown --settings {bad}; valid: {sorted({*SETTINGS, 'ppo'})}")
    torch.set_num_threads(args.threads)
    tok, ex = byte_tokenizer(), addition_prompts(4)
    results, warmups, t0 = [], [], time.perf_counter()
    for seed in seeds:
        warm, warm_steps = warm_model(tok, ex, seed, args)
        warmups.append({"seed": seed, "supervised_steps": warm_steps})
        results += [run_setting(name, warm, tok, ex, args, seed) for name in args.settings.split(",")]
    plot(results, args.png)
    print(json.dumps({"task": "a+b= (a, b in 0..4), exact_match", "steps": args.steps, "seeds": seeds,
                      "warmup": {"target": args.warmup_target, "max_steps": args.warmup_steps, "lr": args.warmup_lr,
                                 "per_seed": warmups},
                      "params": sum(p.numel() for p in warm.parameters()), "torch": torch.__version__,
                      "threads": args.threads, "machine": platform.processor() or platform.machine(),
                      "seconds": round(time.perf_counter() - t0, 1), "png": args.png,
                      "summary": summarize(results), "results": results}))


if __name__ == "__main__":
    main()
