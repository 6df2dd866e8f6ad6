"""Decode speed: scratchlm's engine vs HF transformers `generate()` with the same weights, side by side.

Model: llama-small (vocab 8192, 6 layers, D 384, 6 heads / 2 KV heads, d_ff 1024, tied embeddings),
random weights copied into a local HF LlamaForCausalLM. Greedy, a 16-token prompt, 256 new tokens
(no early stop), batch 1 and batch 8; prefill = one forward over a (1, 256) prompt. Each measurement
is the best of `--repeats` runs, ours and HF's interleaved so machine load hits both alike.
Prints one JSON object.   python benchmarks/decode.py [--dtype bf16] [--compile] [--attn sdpa]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scratchlm.config import get_preset
from scratchlm.generate import generate
from scratchlm.model import TransformerLM

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def hf_copy(model: TransformerLM, attn: str) -> LlamaForCausalLM:
    c = model.config
    cfg = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, tie_word_embeddings=c.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_base}, attention_bias=False, mlp_bias=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=0, attn_implementation=attn,
    )
    hf = LlamaForCausalLM(cfg).eval()
    hf.load_state_dict(model.state_dict(), strict=True)
    return hf


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--attn", choices=["reference", "sdpa"], default="sdpa", help="our attention impl")
    ap.add_argument("--hf-attn", choices=["eager", "sdpa"], default="sdpa")
    ap.add_argument("--compile", action="store_true", help="torch.compile our decode step")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = DTYPES[args.dtype]
    model = TransformerLM(get_preset("llama-small", attn_impl=args.attn)).eval()
    hf = hf_copy(model, args.hf_attn).to(dtype)
    model = model.to(dtype)
    n = args.new_tokens
    prompt = torch.randint(0, model.config.vocab_size, (8, 16))
    result: dict[str, object] = {"dtype": args.dtype, "attn": args.attn, "hf_attn": args.hf_attn,
                                 "compile": args.compile, "new_tokens": n, "prompt_len": 16,
                                 "threads": torch.get_num_threads(), "torch": torch.__version__}

    t0 = time.perf_counter()
    generate(model, prompt[:1].tolist(), 8, compile_decode=args.compile)  # warm-up (and compilation)
    result["warmup_s"] = round(time.perf_counter() - t0, 2)
    for b in (1, 8):
        ids = prompt[:b]
        ours_out: list = []

        def ours() -> None:
            ours_out[:] = generate(model, ids.tolist(), n, compile_decode=args.compile)

        def theirs() -> None:
            with torch.no_grad():
                hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0)

        t_ours, t_hf = float("inf"), float("inf")
        for _ in range(args.repeats):
            t_ours = min(t_ours, best_time(ours, 1))
            t_hf = min(t_hf, best_time(theirs, 1))
        result[f"b{b}_tok_s"] = round(b * n / t_ours, 1)
        result[f"hf_b{b}_tok_s"] = round(b * n / t_hf, 1)
        result[f"b{b}_ratio"] = round(t_hf / t_ours, 2)

    long = torch.randint(0, model.config.vocab_size, (1, 256))
    with torch.inference_mode():
        t_ours = best_time(lambda: model(long, kv_cache=model.new_kv_cache(1, 256)), 3)
        t_hf = best_time(lambda: hf(long, use_cache=True, logits_to_keep=1), 3)
    result["prefill_tok_s"] = round(256 / t_ours, 1)
    result["hf_prefill_tok_s"] = round(256 / t_hf, 1)
    result["prefill_ratio"] = round(t_hf / t_ours, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
