"""Decode speed: scratchlm's engine vs HF transformers `generate()` with the same weights, side by side.

Model: llama-small (vocab 8192, 6 layers, D 384, 6 heads / 2 KV heads, d_ff 1024, tied embeddings),
random weights copied into a local HF LlamaForCausalLM (sdpa attention). Greedy, a 16-token prompt,
256 new tokens (no early stop), batch 1 and batch 8. Variants, each timed in the same process with
the runs interleaved (best of --repeats) so machine load hits all alike:
    ours_fast   scratchlm decode="fast": packed fp32 weights (FastDecoder), same weights and math as HF fp32
    ours_int8   scratchlm decode="fast-int8": int8 weight-only matrices (approximate; reported separately)
    ours_model  scratchlm decode="model": the model's own forward per step (the reference path), fp32
    hf_fp32 / hf_bf16   HF generate in fp32 / bf16
Headline keys: b{1,8}_tok_s = ours_fast, hf_b{1,8}_tok_s = the faster HF variant, b{1,8}_ratio;
int8_b{1,8}_ratio the same for ours_int8, with int8_greedy_agreement = the fraction of its 256 greedy
tokens equal to fp32's (batch 1).
Roofline: decoding one token streams every weight once, so `floor_ms` = (fp32 weight bytes) / (the
memory bandwidth of a GEMV sweep over all of the model's matrices, measured in this run) bounds any
fp32 implementation; b1_ratio_ceiling = HF's b1 step time / floor_ms is the best ratio this machine allows.
Prefill: one forward over a (1, 256) prompt into the cache, logits for the last position only (both).
Prints one JSON object.   python benchmarks/decode.py [--new-tokens 256] [--repeats 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scratchlm.config import get_preset
from scratchlm.generate import generate
from scratchlm.interop.hf.config_json import config_to_hf
from scratchlm.model import TransformerLM

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def hf_copy(model: TransformerLM, attn: str = "sdpa") -> LlamaForCausalLM:
    """HF Llama with our config (mapped by scratchlm.interop) and our weights."""
    hf = LlamaForCausalLM(LlamaConfig(**config_to_hf(model.config, "llama"), attn_implementation=attn)).eval()
    hf.load_state_dict(model.state_dict(), strict=True)
    return hf


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
CLOCK = {"now": time.perf_counter}


def timed(fn) -> float:
    """Seconds fn() took on the selected clock (cpu = this process's CPU time: robust to a busy machine)."""
    now = CLOCK["now"]
    t0 = now()
    fn()
    return now() - t0


def runners(models: dict, ids: torch.Tensor, n: int) -> dict:
    """name -> zero-arg callable generating n tokens for the batch `ids` (B, 16)."""
    out = {}
    for name, (kind, model) in models.items():
        if kind == "hf":
            out[name] = lambda m=model: m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                                   min_new_tokens=n, do_sample=False, pad_token_id=0)
        else:
            out[name] = lambda m=model, d=kind: generate(m, ids.tolist(), n, decode=d)
    return out


def measure_batch(models: dict, prompt: torch.Tensor, b: int, n: int, repeats: int) -> dict[str, float]:
    """tok/s per variant for batch b, best of `repeats` interleaved rounds (after one warm-up each)."""
    fns = runners(models, prompt[:b], n)
    warm = runners(models, prompt[:b], 4)
    best = {name: float("inf") for name in fns}
    with torch.inference_mode():
        for name in fns:
            warm[name]()  # compiles the decode step for this batch shape
        for _ in range(repeats):
            for name, fn in fns.items():
                best[name] = min(best[name], timed(fn))
    return {name: b * n / t for name, t in best.items()}


def measure_prefill(ours: TransformerLM, hf: LlamaForCausalLM, vocab: int, repeats: int) -> dict[str, float]:
    long = torch.randint(0, vocab, (1, 256))
    with torch.inference_mode():
        t_ours = min(timed(lambda: ours(long, kv_cache=ours.new_kv_cache(1, 256), logits_to_keep=1)) for _ in range(repeats))
        t_hf = min(timed(lambda: hf(long, use_cache=True, logits_to_keep=1)) for _ in range(repeats))
    return {"prefill_tok_s": 256 / t_ours, "hf_prefill_tok_s": 256 / t_hf, "prefill_ratio": t_hf / t_ours}


def gemv_floor_ms(model: TransformerLM, repeats: int = 20) -> tuple[float, float]:
    """(ms per sweep of x @ W^T over every matrix of the model once, GB/s): the memory-bound floor."""
    mats = [p.detach().t().contiguous() for p in model.parameters() if p.dim() == 2]  # fresh (in, out) copies
    xs = {m.shape[0]: torch.randn(1, m.shape[0]) for m in mats}
    nbytes = sum(m.numel() * m.element_size() for m in mats)
    best = float("inf")
    for _ in range(repeats):
        t = timed(lambda: [xs[m.shape[0]] @ m for m in mats])
        best = min(best, t)
    return best * 1e3, nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="cpu: process CPU time (use with --threads 1 on a shared machine)")
    args = ap.parse_args()
    CLOCK["now"] = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = TransformerLM(get_preset("llama-small", attn_impl="sdpa", ops_impl="fused")).eval()
    hf = hf_copy(base)
    models = {
        "ours_fast": ("fast", base),
        "ours_int8": ("fast-int8", base),
        "ours_model": ("model", base),
        "hf_fp32": ("hf", hf),
        "hf_bf16": ("hf", hf_copy(base).to(torch.bfloat16)),
    }
    n = args.new_tokens
    prompt = torch.randint(0, base.config.vocab_size, (8, 16))
    result: dict[str, object] = {"new_tokens": n, "prompt_len": 16, "fast": "FastDecoder fp32",
                                 "threads": torch.get_num_threads(), "clock": args.clock, "torch": torch.__version__}
    t0 = time.perf_counter()
    for b in (1, 8):
        tok_s = measure_batch(models, prompt, b, n, args.repeats)
        for name, v in tok_s.items():
            result[f"{name}_b{b}_tok_s"] = round(v, 1)
        hf_best = max(tok_s["hf_fp32"], tok_s["hf_bf16"])
        result[f"b{b}_tok_s"] = round(tok_s["ours_fast"], 1)
        result[f"hf_b{b}_tok_s"] = round(hf_best, 1)
        result[f"b{b}_ratio"] = round(tok_s["ours_fast"] / hf_best, 2)
        result[f"int8_b{b}_ratio"] = round(tok_s["ours_int8"] / hf_best, 2)
        result[f"model_b{b}_ratio_vs_hf_fp32"] = round(tok_s["ours_model"] / tok_s["hf_fp32"], 2)
    floor_ms, gb_s = gemv_floor_ms(base)
    hf_step_ms = 1e3 / result["hf_b1_tok_s"]
    result.update({"floor_ms": round(floor_ms, 3), "stream_gb_s": round(gb_s, 1), "hf_b1_step_ms": round(hf_step_ms, 3),
                   "ours_b1_step_ms": round(1e3 / result["b1_tok_s"], 3), "b1_ratio_ceiling": round(hf_step_ms / floor_ms, 2)})
    with torch.inference_mode():
        ids = prompt[:1].tolist()
        same = [a == b for a, b in zip(generate(base, ids, n, decode="fast")[0], generate(base, ids, n, decode="fast-int8")[0])]
    result["int8_greedy_agreement"] = round(sum(same) / len(same), 3)
    result.update({k: round(v, 2) for k, v in measure_prefill(base, hf, base.config.vocab_size, 3).items()})
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
