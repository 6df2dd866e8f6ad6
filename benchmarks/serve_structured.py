"""Structured output's cost per decode step at vocabulary scale: json_schema vs plain decoding, in the same run.

Model: SmolLM2-135M-Instruct (the Q4_1 GGUF fixture on its own blocks; the server's default decode, "auto" =
fast-gguf), 49152-token vocabulary. Two measurements:

    step    the server's Scheduler in this process: --rows sequences of a chat prompt (its chat template),
            sampled (temperature 0.8, one seed each) for --tokens tokens, plain vs response_format json_schema
            (serve_load.py's schema, through serve/structured.py as the server builds it), after one warm-up
            pass with other seeds (a server that has seen the schema before). Median wall time of the decode
            steps that hold all rows, ms; ratio = json_schema / plain (the issue's target: <= 1.10).
    masks   the constraint's own work per step for --rows rows, given random logits: the rows' masks
            (GrammarMasks.allowed), applying them to the (rows, V) logits (serve/token_choice.py), sampling the
            allowed token and advancing each automaton; ms per step on the first pass over new seeds (states
            seen for the first time: cold) and on a pass repeating them (warm), and the argmax alone over the
            same logits (what any decoding pays: extra_ms_per_step_warm is the constraint's own share). On the real 49k vocabulary
            and on a synthetic 262,144-token one: the 49k tokens plus tokens extended by a character of
            another script or by a short token (Gemma-class size; index_s: building its vocabulary index).
Prints one JSON object (last line).   python benchmarks/serve_structured.py [--rows 16] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "tests"))
from quiet import wait_quiet  # noqa: E402
from smollm2_fixture import locate_smollm2  # noqa: E402

from scratchlm.generate.constrained import GrammarMasks, TokenConstraint, VocabIndex, compile_schema  # noqa: E402
from scratchlm.generate.constrained.vocab_index import vocabulary_bytes  # noqa: E402
from scratchlm.generate.sampling import SamplingParams  # noqa: E402
from scratchlm.load.model_loader import load_pretrained  # noqa: E402
from scratchlm.serve.scheduler import Scheduler  # noqa: E402
from scratchlm.serve.sequence import Sequence  # noqa: E402
from scratchlm.serve.structured import StructuredOutput  # noqa: E402
from scratchlm.serve.token_choice import apply_constraints  # noqa: E402
from scratchlm.tokenizer.chat.render import default_stop_ids  # noqa: E402
from scratchlm.tokenizer.chat.template import ChatTemplate  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "lines": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "lines"]}
QUIET: dict = {}
SCRIPTS = "éßøçñ" + "жщыюя" + "中文字词语" + "नमस्ते" + "こんにちは" + "😀🚀✨"


def synthetic_vocab(base: list[bytes | None], size: int, seed: int = 0) -> list[bytes | None]:
    """base + distinct extensions (token + a character of another script, or token + a token of <= 4 bytes)."""
    rng = random.Random(seed)
    words = [t for t in base if t]
    short = [t for t in words if len(t) <= 4]
    chars = [c.encode() for c in SCRIPTS]
    seen, out = set(words), list(base)
    while len(out) < size:
        t = rng.choice(words) + (rng.choice(chars) if rng.random() < 0.5 else rng.choice(short))
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def mask_pass(masks: GrammarMasks, rows: int, tokens: int, seed: int) -> tuple[float, float]:
    """(ms per step choosing the rows' tokens from random logits (rows, V) with the constraint, the same
    without it: argmax alone), over `tokens` steps of `rows` constrained rows."""
    g = torch.Generator().manual_seed(seed)
    size = masks.index.size
    seqs = [SimpleNamespace(constraint=TokenConstraint(masks), max_tokens=tokens, tokens=[]) for _ in range(rows)]
    total = plain = 0.0
    steps = 0
    for _ in range(tokens):
        live = [s for s in seqs if not s.constraint.complete and len(s.tokens) < s.max_tokens]
        if not live:
            break
        logits = torch.randn(len(live), size, generator=g) * 3  # (rows, V)
        t0 = time.perf_counter()
        torch.argmax(logits, dim=-1).tolist()
        t1 = time.perf_counter()
        chosen = torch.argmax(apply_constraints(logits, live), dim=-1).tolist()
        for s, tok in zip(live, chosen):
            s.tokens.append(tok)
            if tok < size and masks.index.tokens[tok] is not None:
                s.constraint.advance(tok)
            else:  # a stop token: the text is complete
                s.max_tokens = len(s.tokens)
        total += time.perf_counter() - t1
        plain += t1 - t0
        steps += 1
    return 1000 * total / max(steps, 1), 1000 * plain / max(steps, 1)


def masks_phase(name: str, vocab: list[bytes | None], args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    index = VocabIndex(vocab)
    index.plain(None)
    index_s = time.perf_counter() - t0
    masks = GrammarMasks(compile_schema(SCHEMA), index, [0])
    wait_quiet(timeout_s=args.quiet_timeout, stats=QUIET)
    cold = [mask_pass(masks, args.rows, args.tokens, seed) for seed in range(3)]
    warm = [mask_pass(masks, args.rows, args.tokens, seed) for seed in range(3)]  # the same seeds: every state seen
    med = lambda runs, i: round(statistics.median(r[i] for r in runs), 3)  # noqa: E731
    return {"vocab": len(vocab), "index_s": round(index_s, 2), "ms_per_step_cold": med(cold, 0),
            "ms_per_step_warm": med(warm, 0), "ms_per_step_argmax_only": med(warm, 1),
            "extra_ms_per_step_warm": round(med(warm, 0) - med(warm, 1), 3), "cached_masks": len(masks._masks),
            "cached_mask_mb": round(masks._mask_bytes / 2**20, 1), "states": len(masks._specs)}


def scheduler_pass(sched: Scheduler, make: callable, rows: int, seed0: int) -> list[float]:
    """Run `rows` fresh sequences to the end; wall ms of each decode step that held all rows."""
    seqs = [make(seed0 + i) for i in range(rows)]
    sched.submit(seqs)
    sched.step()  # admission: prefill + token 1
    times = []
    while sched.rows:
        n = len(sched.rows)
        t0 = time.perf_counter()
        sched.step()
        if n == rows:
            times.append(1000 * (time.perf_counter() - t0))
    return times


def step_phase(loaded, args: argparse.Namespace) -> dict:
    model, tok = loaded.model, loaded.tokenizer
    template = ChatTemplate(loaded.chat_template)
    prompt = tok.encode(template.render([{"role": "user", "content": "Describe a character of a play as JSON: "
                                          "name, age, and a few of their lines."}], add_generation_prompt=True))
    vocab = model.config.vocab_size
    stops = list(dict.fromkeys([*loaded.stop_token_ids, *default_stop_ids(tok)]))
    structured = StructuredOutput(tok, vocab, stops)
    t0 = time.perf_counter()
    grammar = structured.masks(json.dumps(SCHEMA, sort_keys=True), lambda: compile_schema(SCHEMA))
    index_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.8)

    def make(constrained: bool):
        def one(seed: int) -> Sequence:
            return Sequence.create(0, prompt, args.tokens, params, lambda e: None, tokenizer=tok, vocab_size=vocab,
                                   seed=seed, stop_token_ids=tuple(stops) if constrained else (),
                                   constraint=TokenConstraint(grammar) if constrained else None)
        return one

    sched = Scheduler(model, max_batch=args.rows, decode="auto", context=1024)
    out = {"rows": args.rows, "tokens": args.tokens, "index_s": round(index_s, 2)}
    for name, constrained in (("plain", False), ("json_schema", True)):
        scheduler_pass(sched, make(constrained), args.rows, 1000)  # warm-up: other seeds
    for name, constrained in (("plain", False), ("json_schema", True)):
        wait_quiet(timeout_s=args.quiet_timeout, stats=QUIET)
        times = scheduler_pass(sched, make(constrained), args.rows, 0)
        out[f"ms_per_step_{name}"] = round(statistics.median(times), 2)
        out[f"steps_{name}"] = len(times)
    out["json_schema_over_plain"] = round(out["ms_per_step_json_schema"] / out["ms_per_step_plain"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quiet-timeout", type=float, default=60.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_pretrained(locate_smollm2())
    base = vocabulary_bytes(loaded.tokenizer, loaded.model.config.vocab_size)
    result = {"benchmark": "serve_structured", "threads": args.threads, "torch": torch.__version__,
              "step": step_phase(loaded, args),
              "masks_49k": masks_phase("49k", base, args),
              "masks_262k": masks_phase("262k", synthetic_vocab(base, 262144), args)}
    result["quiet"] = QUIET
    print(json.dumps(result))


if __name__ == "__main__":
    main()
