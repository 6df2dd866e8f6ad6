"""b1 decode through each one-row kernel route — the repacked copies (gemv_r16.h), gemv_fixed24.h on the file's
blocks (24-bit fixed-point x, integer dot products; AVX512-VNNI, or gemv_fixed24_avx2.h's Q5_K / Q6_K on AVX2), the
centered sub-block sums (gemv_centered*.h), gemv.h's widening — and llama.cpp, in one process on the same GGUF file.

`python benchmarks/gemv_centered.py [--only NAME] [--rounds 8] [--steps 32]`

The VM this project is measured on swings by 20-40% over minutes, more than the change measured here, so the
engines run in one process, alternating blocks of --steps decode steps (2 threads each; a wait for a quiet
machine before each round): scratchlm `fast-gguf` as it runs by default (`default`: the Q4_K / Q4_0 / Q2_K / Q3_K
matrices from their repacked copies, the rest as `fixed24`), a second load of the file with SCRATCHLM_REPACK=0
(`fixed24`: gemv_fixed24.h for the K-quants and gemv_fixed24_b32.h for Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / IQ4_XS
where built, the centered sums for the rest, all on the file's blocks), that model with `set_fixed24(False)`
(`centered`) and with `set_centered(False)` too (`widened`: gemv.h for every type), and llama.cpp
(llama-cpp-python) on the same file.
Every engine decodes token 1000 after a 16-token prompt, so all run the same shapes. The files are
gguf_decode.py's (SmolLM2 re-quantized by llama.cpp, the shipped Q4_1, the random 1B / 3B Llama Q4_K_M: made
there when missing). Prints one JSON object last: per file tok/s of each engine (steps / total time) and the
per-round ratios default / fixed24 (the copies' gain), fixed24 / centered, centered / widened and default / llama.cpp
(`has_fixed24`: false where the build has no gemv_fixed24.h; `fixed24_types`: the types whose one row runs the
fixed-point arithmetic in this build; the others run in fixed24 and default what centered runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def measure(path: Path, rounds: int, steps: int, quiet: dict, quiet_timeout: float) -> dict:
    """The engines on one file, alternating blocks of `steps` steps over `rounds` rounds."""
    import os

    import torch
    from gguf_decode import file_types
    from llama_cpp import Llama
    from quiet import wait_quiet

    from scratchlm.generate.decode_step import make_decode_step, resolve_decode
    from scratchlm.generate.prefill import prefill
    from scratchlm.interop.gguf.model_load import load_gguf
    from scratchlm.kernels.build import native

    torch.set_num_threads(2)
    prompt, token = list(range(100, 116)), 1000
    length = len(prompt) + (rounds + 1) * steps + 8
    llm = Llama(model_path=str(path), n_ctx=length, n_threads=2, n_threads_batch=2, verbose=False)
    llm.eval(prompt)
    models, steps_of = {}, {}
    for name, repack in (("default", "1"), ("in_place", "0")):  # each load maps the file again: its own blocks
        before = os.environ.get("SCRATCHLM_REPACK")
        os.environ["SCRATCHLM_REPACK"] = repack
        try:
            models[name] = load_gguf(path, attn_impl="sdpa")
            steps_of[name] = make_decode_step(models[name], resolve_decode(models[name], "fast-gguf"))
        finally:
            os.environ.pop("SCRATCHLM_REPACK") if before is None else os.environ.update(SCRATCHLM_REPACK=before)
    mod = native()
    ours_names = ("default", "fixed24", "centered", "widened")
    which = {name: "default" if name == "default" else "in_place" for name in ours_names}
    times = {k: 0.0 for k in (*ours_names, "llamacpp")}
    per_round = []
    try:
        with torch.inference_mode():
            caches = {k: models[which[k]].new_kv_cache(1, max_seq_len=length) for k in ours_names}
            for k, cache in caches.items():
                prefill(models[which[k]], torch.tensor([prompt]), torch.arange(len(prompt))[None], None, cache)

            def ours(name: str) -> float:
                mod.set_fixed24(name in ("default", "fixed24"))
                mod.set_centered(name != "widened")
                cache, step = caches[name], steps_of[which[name]]
                t0 = time.perf_counter()
                for _ in range(steps):
                    step(torch.tensor([[token]]), torch.tensor([[cache.seq_len]]), None, cache)
                return time.perf_counter() - t0

            def theirs() -> float:
                t0 = time.perf_counter()
                for _ in range(steps):
                    llm.eval([token])
                return time.perf_counter() - t0

            for name in ours_names:  # warm-up: first-call costs, pages of the file
                ours(name)
            theirs()
            for _ in range(rounds):
                wait_quiet(timeout_s=quiet_timeout, stats=quiet)
                r = {name: ours(name) for name in ours_names}
                r["llamacpp"] = theirs()
                for k, v in r.items():
                    times[k] += v
                per_round.append(r)
    finally:
        mod.set_centered(True)
        mod.set_fixed24(True)
        llm.close()
    return {"tok_s": {k: round(rounds * steps / v, 2) for k, v in times.items()},
            "default_over_fixed24": [round(r["fixed24"] / r["default"], 3) for r in per_round],
            "fixed24_over_centered": [round(r["centered"] / r["fixed24"], 3) for r in per_round],
            "centered_over_widened": [round(r["widened"] / r["centered"], 3) for r in per_round],
            "default_over_llamacpp": [round(r["llamacpp"] / r["default"], 3) for r in per_round],
            "has_fixed24": bool(mod.has_fixed24()), "fixed24_types": list(mod.fixed24_types()),
            "types": file_types(path)}


def main() -> None:
    from gguf_decode import file_options, selected_files

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=32, help="decode steps per engine per round")
    file_options(p)
    args = p.parse_args()
    files = selected_files(args)
    quiet: dict = {}
    report = {"files": {}, "settings": {"rounds": args.rounds, "steps": args.steps, "threads": 2}}
    for name, path in files.items():
        report["files"][name] = measure(path, args.rounds, args.steps, quiet, args.quiet_timeout)
        print(name, json.dumps(report["files"][name]), flush=True)
    report["quiet"] = quiet
    print(json.dumps(report))


if __name__ == "__main__":
    main()
