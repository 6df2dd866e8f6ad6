"""`scratchlm generate`: continue a text prompt with a trained checkpoint, streaming the reply.

    scratchlm generate --checkpoint runs/tiny --prompt "Once upon a time" --max-new-tokens 100 \
        --temperature 0.8 --top-p 0.95 --seed 0
    scratchlm generate --checkpoint model.gguf --prompt "..." --speculative ngram      (prompt-lookup drafts)
--checkpoint names a scratchlm checkpoint dir, an HF model dir or a .gguf file (scratchlm.load.model_loader); the
model's own tokenizer and end-of-reply tokens are used. Sampling flags map one-to-one onto
scratchlm.generate.SamplingParams; the shared flag helpers live here (chat uses them).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from scratchlm.generate.decode_step import DECODE_MODES
from scratchlm.generate.prefill import PREFILL_MODES
from scratchlm.generate.sampling import SamplingParams
from scratchlm.generate.speculative import SPEC_METHODS, Speculation
from scratchlm.generate.streaming import stream_generate
from scratchlm.load import LoadedModel, load_pretrained
from scratchlm.load.tokenizers import load_tokenizer_dir

DTYPES = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16}  # auto: as stored (a GGUF on its blocks)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="model: a scratchlm checkpoint dir, an HF model dir or a .gguf file")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer dir (default: the model's own)")
    p.add_argument("--attn", choices=["reference", "sdpa"], default="sdpa", help="attention implementation")
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="weights: auto = as stored (a .gguf runs on its own quantized blocks, memory ~ the file; "
                        "other models fp32; default); fp32 / bf16 = a dense copy in that dtype")
    p.add_argument("--decode", choices=DECODE_MODES, default="auto",
                   help="decode step: auto = the fastest exact one (fast-gguf on a GGUF's blocks, else fast; "
                        "default); fast = packed weights, same output as the model; model = the "
                        "reference forward; fast-gguf = a GGUF's own blocks (exact); fast-gguf-a8 = those blocks "
                        "with 8-bit activations, prompts up to 256 tokens too (llama.cpp's CPU scheme; approximate); fast-bf16 / fast-q8_0 / "
                        "fast-q4_1 / fast-int8 = compact weights (approximate); fast-q8_0-a8 / fast-q4_1-a8 = "
                        "Q8_0 / Q4_1 blocks with 8-bit activations (approximate); "
                        "compiled = torch.compile (slow warm-up); see benchmarks/RESULTS.md")
    p.add_argument("--prefill", choices=PREFILL_MODES, default="model",
                   help="prompt path: model = the model's own dtype (default); bf16 = a bf16 copy of the model "
                        "(faster on CPUs with bf16 matmul units; bf16 rounding of the prompt's activations)")


def add_sampling_args(p: argparse.ArgumentParser, max_new_tokens: int) -> None:
    """Flags for SamplingParams, max_new_tokens (default: `max_new_tokens`, capped to the context), seed, stops."""
    d = SamplingParams()
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens to generate (default: {max_new_tokens}, capped to what fits the model's context, "
                        "said on stderr; an explicit value that does not fit is an error)")
    p.set_defaults(default_max_new_tokens=max_new_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=d.top_k, help="0 = off")
    p.add_argument("--top-p", type=float, default=d.top_p, help="1 = off")
    p.add_argument("--min-p", type=float, default=d.min_p, help="0 = off")
    p.add_argument("--repetition-penalty", type=float, default=d.repetition_penalty, help="1 = off (HF formula)")
    p.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty, help="0 = off (OpenAI formula)")
    p.add_argument("--presence-penalty", type=float, default=d.presence_penalty, help="0 = off (OpenAI formula)")
    p.add_argument("--seed", type=int, default=None, help="seed the sampler for reproducible output")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """SamplingParams fields + seed + stop strings from parsed flags (validated by SamplingParams)."""
    fields = {f: getattr(args, f) for f in SamplingParams.__dataclass_fields__}
    SamplingParams(**fields)
    return {**fields, "seed": args.seed, "stop_strings": args.stop, "decode": args.decode, "prefill": args.prefill}


def load_for_generation(args: argparse.Namespace) -> LoadedModel:
    """The model (eval mode) with its tokenizer and stop tokens from --checkpoint / --tokenizer / --attn / --dtype."""
    loaded = load_pretrained(args.checkpoint, tokenizer=args.tokenizer, dtype=DTYPES[args.dtype], attn_impl=args.attn)
    if args.tokenizer is not None:
        check_tokenizer_override(loaded, args.tokenizer)
    return loaded


def check_tokenizer_override(loaded: LoadedModel, tokenizer_dir: str) -> None:
    """Refuse a --tokenizer of another size than the tokenizer stored with the model (its ids would decode
    to garbage); without a stored one, a tokenizer smaller than the vocabulary is a note on stderr.
    (A tokenizer larger than the model's vocabulary is refused by scratchlm.load.model_loader.)"""
    tok_vocab, model_vocab = loaded.tokenizer.vocab_size, loaded.model.config.vocab_size
    if tok_vocab == model_vocab:
        return
    own = model_vocab if loaded.kind == "gguf" else None  # a GGUF's vocabulary is its token list
    if own is None:
        try:
            own = load_tokenizer_dir(loaded.path, prefer_hf=loaded.kind == "hf").vocab_size
        except (FileNotFoundError, ValueError):
            pass
    if own is not None and own != tok_vocab:
        raise ValueError(f"--tokenizer {tokenizer_dir} has {tok_vocab} tokens but {loaded.path} comes with a "
                         f"{own}-token tokenizer (model vocab_size {model_vocab}); its ids would decode to garbage. "
                         "Pass the tokenizer the model was trained with, or leave --tokenizer out")
    if own is None:
        print(f"note: the tokenizer has {tok_vocab} tokens and the model {model_vocab}; sampled ids >= {tok_vocab} "
              "cannot be decoded", file=sys.stderr)


def fit_max_new_tokens(args: argparse.Namespace, prompt_len: int, max_seq_len: int) -> int:
    """--max-new-tokens, or its default capped to the room left after the prompt (said on stderr)."""
    if args.max_new_tokens is not None:
        return args.max_new_tokens  # explicit: the engine refuses it with the largest value that fits
    room = max_seq_len - prompt_len
    if room <= 0:
        raise ValueError(f"--prompt is {prompt_len} tokens, which fills the model's {max_seq_len}-token context; "
                         "shorten it")
    n = min(args.default_max_new_tokens, room)
    if n < args.default_max_new_tokens:
        print(f"[--max-new-tokens {n}: the default {args.default_max_new_tokens} does not fit the model's "
              f"{max_seq_len}-token context after the {prompt_len}-token prompt]", file=sys.stderr)
    return n


def write_stream(deltas) -> str:
    """Print text deltas as they come (flushed); return the whole text."""
    parts = []
    for delta in deltas:
        sys.stdout.write(delta)
        sys.stdout.flush()
        parts.append(delta)
    return "".join(parts)


def run_generate(args: argparse.Namespace) -> int:
    loaded = load_for_generation(args)
    prompt = loaded.tokenizer.prompt_ids(args.prompt)  # with the BOS the model's tokenizer adds, if any
    if not prompt:
        raise ValueError("--prompt encodes to no tokens; give some text")
    kw = sampling_kwargs(args)
    n_new = fit_max_new_tokens(args, len(prompt), loaded.model.config.max_seq_len)
    write_stream(stream_generate(loaded.model, loaded.tokenizer, prompt, n_new,
                                 stop_token_ids=loaded.stop_token_ids, speculative=speculation(args, loaded), **kw))
    sys.stdout.write("\n")
    return 0


def speculation(args: argparse.Namespace, loaded: LoadedModel) -> Speculation | None:
    """--speculative / --draft-model / --draft-tokens as a Speculation (None: off); the draft model must share
    the target's vocabulary."""
    method = "draft" if args.draft_model and args.speculative is None else args.speculative
    if method is None:
        return None
    if method == "draft" and not args.draft_model:
        raise ValueError("--speculative draft needs --draft-model PATH (a small model with the same tokenizer)")
    draft = None
    if method == "draft":
        draft = load_pretrained(args.draft_model, dtype=DTYPES[args.dtype], attn_impl=args.attn).model
        if draft.config.vocab_size != loaded.model.config.vocab_size:
            raise ValueError(f"--draft-model {args.draft_model} has {draft.config.vocab_size} tokens and the model "
                             f"{loaded.model.config.vocab_size}: a draft must share the model's tokenizer")
    if not 1 <= args.draft_tokens <= 32:
        raise ValueError(f"--draft-tokens {args.draft_tokens} must be in [1, 32]")
    return Speculation(method, k=args.draft_tokens, draft_model=draft)


def add_speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speculative", choices=SPEC_METHODS, default=None,
                   help="speculative decoding: draft up to --draft-tokens tokens (per stream in serve), check them "
                        "in one forward; ngram = prompt lookup (code edits, summaries, quotes), draft = --draft-model. "
                        "The same text when greedy, the same distribution when sampling; default off")
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="a small model with the same tokenizer that drafts for --speculative draft (implies it)")
    p.add_argument("--draft-tokens", type=int, default=4, metavar="K",
                   help="tokens drafted per forward at most (default 4; 2 more after all were accepted, 1 fewer "
                        "after a rejection)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a checkpoint (streams the text)")
    add_model_args(p)
    p.add_argument("--prompt", required=True, help="text to continue")
    add_sampling_args(p, max_new_tokens=128)
    add_speculative_args(p)
    p.set_defaults(func=run_generate)
