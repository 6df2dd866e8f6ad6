"""BPE speed: scratchlm training vs HF `tokenizers` BpeTrainer, and encode throughput of our reference
encoder, our tiktoken fast path and tiktoken itself, side by side in one run.

Training: ../shared/data/tinyshakespeare.txt, vocab 4096, special <|endoftext|>, GPT-2 pre-tokenization
(HF: ByteLevel(add_prefix_space=False) with the 256-byte initial alphabet), best of `--repeats`, ours and
HF's interleaved so machine load hits both alike. Encoding: the whole file (1.1 MB) with the tokenizer we
just trained; the reference encoder starts with a cold pre-token cache each run; tiktoken is an Encoding
built from the same merges (and GPT-2's, from ../shared/data) calling `encode(text, allowed_special="all")`.
Prints one JSON object.   python benchmarks/bpe.py [--repeats 3] [--encode-repeats 6] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import tiktoken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers

from scratchlm.tokenizer import Tokenizer, train_bpe
from scratchlm.tokenizer.formats import load_gpt2_files
from scratchlm.tokenizer.pretokenize import GPT2_PATTERN

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SPECIALS = ["<|endoftext|>"]


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
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
    raw = tiktoken.Encoding("bench", pat_str=GPT2_PATTERN, mergeable_ranks=dict(fast._ids),
                            special_tokens=dict(tok.special_token_ids))

    def ref():
        tok._cache.clear()
        return tok.encode(text)

    t_ref, ids_ref = best_of(ref, 2)
    runs = {"fast": lambda: fast.encode(text), "tiktoken": lambda: raw.encode(text, allowed_special="all")}
    best, ids = {k: float("inf") for k in runs}, {}
    for r in range(2 * repeats):  # interleaved, alternating which goes first
        for k in sorted(runs, reverse=bool(r % 2)):
            t, ids[k] = best_of(runs[k], 1)
            best[k] = min(best[k], t)
    t_fast, t_tik, ids_fast, ids_tik = best["fast"], best["tiktoken"], ids["fast"], ids["tiktoken"]
    assert ids_ref == ids_fast == ids_tik, "encoders disagree"
    return {"ref": mb / t_ref, "fast": mb / t_fast, "tiktoken": mb / t_tik, "tokens": len(ids_ref)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--encode-repeats", type=int, default=6, help="interleaved rounds for fast vs tiktoken")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args()
    path = DATA / "tinyshakespeare.txt"
    t_ours = t_hf = float("inf")
    for _ in range(args.repeats):
        t, (vocab, merges) = best_of(lambda: train_bpe(path, args.vocab_size, SPECIALS, num_workers=args.workers), 1)
        t_ours = min(t_ours, t)
        t, hf = best_of(lambda: hf_train(path, args.vocab_size), 1)
        t_hf = min(t_hf, t)
    tok = Tokenizer(vocab, merges, SPECIALS)
    text = path.read_text(encoding="utf-8")
    rates = encode_rates(tok, text, args.encode_repeats)
    gpt2 = encode_rates(load_gpt2_files(DATA / "gpt2_vocab.json", DATA / "gpt2_merges.txt"), text, args.encode_repeats)
    print(json.dumps({
        "corpus": "tinyshakespeare.txt", "corpus_mb": round(len(text.encode()) / 1e6, 3), "vocab_size": args.vocab_size,
        "train_s": round(t_ours, 3), "hf_train_s": round(t_hf, 3), "train_vs_hf": round(t_ours / t_hf, 2),
        "hf_vocab_size": hf.get_vocab_size(), "tokens": rates["tokens"],
        "ref_encode_mb_s": round(rates["ref"], 3), "fast_encode_mb_s": round(rates["fast"], 3),
        "tiktoken_encode_mb_s": round(rates["tiktoken"], 3), "fast_vs_tiktoken": round(rates["fast"] / rates["tiktoken"], 3),
        "gpt2_ref_encode_mb_s": round(gpt2["ref"], 3), "gpt2_fast_encode_mb_s": round(gpt2["fast"], 3),
        "gpt2_tiktoken_encode_mb_s": round(gpt2["tiktoken"], 3),
        "gpt2_fast_vs_tiktoken": round(gpt2["fast"] / gpt2["tiktoken"], 3),
    }))


if __name__ == "__main__":
    main()
