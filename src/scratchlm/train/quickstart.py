"""The main job: corpus -> BPE tokenizer -> token file -> a few minutes of pretraining -> samples.

    OUT/corpus.txt            the training text (default corpus, or --data PATH)
    OUT/tokenizer/            the trained byte-level BPE (also copied into every checkpoint)
    OUT/tokens.bin(.json)     the encoded corpus (train = first 90%, val = last 10%)
    OUT/checkpoint/           config.json + model.safetensors + tokenizer + trainer state
    OUT/metrics.jsonl, OUT/loss.png
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scratchlm.model_files import load_model
from scratchlm.config import get_preset
from scratchlm.data.corpus import default_corpus, load_corpus
from scratchlm.data.batches import train_val_split
from scratchlm.data.token_file import open_token_file, write_token_file
from scratchlm.io_utils import atomic_write_text, claim_run_dir, release_replaced
from scratchlm.train.loop import train
from scratchlm.train.losses import bits_per_byte
from scratchlm.train.train_config import TrainConfig
from scratchlm.train.presets import get_train_preset

PROMPTS = ("def ", "The ", "import ", "class ")


@dataclass
class QuickstartResult:
    out_dir: Path
    checkpoint: Path
    val_loss: float | None
    val_bits_per_byte: float | None
    samples: dict[str, str]


def build_tokens(out: Path, data: str | None, max_bytes: int, vocab_size: int, progress: bool) -> int:
    """Write OUT/corpus.txt, OUT/tokenizer/ and OUT/tokens.bin; returns the vocab size."""
    from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe
    from scratchlm.tokenizer.stream_encode import encode_stream_chunks

    text = load_corpus(data, max_bytes) if data else default_corpus(max_bytes)
    atomic_write_text(out / "corpus.txt", text)
    print(f"corpus: {len(text.encode('utf-8')):,} bytes -> {out / 'corpus.txt'}", flush=True)
    vocab, merges = train_bpe(out / "corpus.txt", vocab_size, DEFAULT_SPECIAL_TOKENS, progress=progress)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    tok.save(out / "tokenizer")
    n_tokens = write_token_file(out / "tokens.bin", encode_stream_chunks(tok, [text]), tok.vocab_size)
    print(f"tokenizer: {tok.vocab_size} tokens -> {out / 'tokenizer'}; corpus = {n_tokens:,} tokens", flush=True)
    return tok.vocab_size


def val_bits_per_byte(val_loss: float, out: Path, val_fraction: float) -> float:
    """Loss in bits per UTF-8 byte of the validation split (its own tokens/bytes ratio)."""
    from scratchlm.tokenizer import Tokenizer

    _, val = train_val_split(open_token_file(out / "tokens.bin"), val_fraction)
    n_bytes = len(Tokenizer.load(out / "tokenizer").decode_bytes(val.tolist()))
    return bits_per_byte(val_loss, len(val), n_bytes)


def sample(checkpoint: Path, prompts: tuple[str, ...] = PROMPTS, max_new_tokens: int = 60, seed: int = 0) -> dict[str, str]:
    """Temperature-0.8/top-k-40 continuations of each prompt from the saved model and its tokenizer."""
    from scratchlm.generate.engine import generate
    from scratchlm.tokenizer import Tokenizer

    model = load_model(checkpoint).eval()
    tok = Tokenizer.load(checkpoint)
    ids = [tok.encode(p) for p in prompts]
    room = model.config.max_seq_len - max(map(len, ids))  # the engine never slides its window
    outs = generate(model, ids, min(max_new_tokens, room), seed=seed, temperature=0.8, top_k=40)
    return {p: p + tok.decode(o) for p, o in zip(prompts, outs)}


def _check_args(data: str | None, minutes: float, vocab_size: int, max_bytes: int) -> None:
    """One-line errors for quickstart's own arguments, before anything is written."""
    from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS

    if data is not None and not Path(data).exists():
        raise FileNotFoundError(f"--data {data} does not exist; give a .txt/.jsonl file or a directory of them")
    if not minutes > 0:
        raise ValueError(f"--minutes must be > 0, got {minutes}")
    if vocab_size <= 256 + len(DEFAULT_SPECIAL_TOKENS):
        raise ValueError(f"--vocab-size {vocab_size} leaves no merges: it must exceed 256 bytes + "
                         f"{len(DEFAULT_SPECIAL_TOKENS)} special tokens")
    if max_bytes <= 0:
        raise ValueError(f"--max-bytes must be positive, got {max_bytes}")


def quickstart(
    out_dir: str | Path = "runs/quickstart", /, data: str | None = None, minutes: float = 3.0, vocab_size: int = 2048,
    max_bytes: int = 4_000_000, overwrite: bool = False, progress: bool = True, **overrides: Any,
) -> QuickstartResult:
    """Build the corpus and tokenizer, train the `quickstart` preset for `minutes`, sample from it."""
    owned = {"out_dir": "--out DIR", "train_data": "--data PATH", "tokenizer_dir": "(built by quickstart)",
             "max_time_s": "--minutes N", "model.vocab_size": "--vocab-size N"}
    clash = sorted(set(overrides) & set(owned))
    if clash:
        raise ValueError(f"quickstart sets {clash} itself; use {', '.join(owned[k] for k in clash)} instead "
                         "(other TrainConfig fields can be overridden as --key=value)")
    out = Path(out_dir)
    _check_args(data, minutes, vocab_size, max_bytes)

    def config(vocab: int) -> TrainConfig:
        return get_train_preset("quickstart", train_data=str(out / "tokens.bin"), tokenizer_dir=str(out / "tokenizer"),
                                out_dir=str(out), max_time_s=minutes * 60, progress=progress,
                                **{"model.vocab_size": vocab}, **overrides)

    get_preset(config(vocab_size).model_preset, **config(vocab_size).model)  # bad overrides fail before any write
    replaced = claim_run_dir(out, overwrite)  # refuses a non-empty --out unless overwrite (scratchlm.io_utils)
    cfg = config(build_tokens(out, data, max_bytes, vocab_size, progress))
    result = train(cfg, claimed=True)
    bpb = val_bits_per_byte(result.val_loss, out, cfg.val_fraction) if result.val_loss is not None else None
    samples = sample(result.checkpoint)
    release_replaced(replaced)
    return QuickstartResult(out, result.checkpoint, result.val_loss, bpb, samples)
