"""Named TrainConfig presets (plain Python, looked up by exact name; the error lists them).

- smoke: a seconds-long run of a very small llama (CI, first try).
- quickstart: the main job's tiny llama on the default corpus, sized for a few minutes on 2 CPU cores
  (fp32: at this size bf16 autocast on CPU measured up to 15x slower per step with 2 threads).
- shakespeare-char: the winning CPU speedrun recipe on character-level tinyshakespeare
  (benchmarks/speedrun_shakespeare.py); pass --train_data with a char-level token file.
"""

from __future__ import annotations

from typing import Any, Callable

from scratchlm.train.train_config import TrainConfig

# torch's fused AdamW; the LM head fused with the loss over chunks of positions (train/chunked_ce.py: no whole
# logits; 1.17x the llama-small step with torch's cross entropy on the whole logits, fp32 and bf16, Zen 5)
FAST = dict(optimizer_impl="torch", loss_impl="chunked")
# the model-side fast paths (torch SDPA, fused norms/activations/RoPE, fp32 products through oneDNN), each tested
# equal to the reference
FAST_MODEL = {"attn_impl": "sdpa", "ops_impl": "fused"}


def _smoke() -> TrainConfig:
    return TrainConfig(
        model={"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64, **FAST_MODEL},
        batch_size=8, seq_len=64, max_steps=50, warmup_steps=5, lr=3e-3, min_lr=3e-4, eval_interval=25,
        eval_batches=4, ckpt_interval=50, log_interval=5, out_dir="runs/smoke", **FAST,
    )


def _quickstart() -> TrainConfig:
    return TrainConfig(
        model={"d_model": 192, "n_layers": 4, "n_heads": 6, "n_kv_heads": 2, "max_seq_len": 128, **FAST_MODEL},
        batch_size=16, seq_len=128, max_steps=2000, max_time_s=180.0, warmup_steps=50, lr=2e-3, min_lr=2e-4,
        schedule="wsd", decay_frac=0.3, dtype="fp32", eval_interval=100, eval_batches=10, ckpt_interval=200,
        log_interval=10, out_dir="runs/quickstart", **FAST,
    )


def _shakespeare_char() -> TrainConfig:
    """Llama-style (RoPE, RMSNorm, SwiGLU, untied head) at the classic recipe's width, with twice the
    context (2x the tokens per step), 3x the peak lr and a WSD schedule (benchmarks/RESULTS.md)."""
    return TrainConfig(
        model={"d_model": 128, "n_layers": 4, "n_heads": 4, "max_seq_len": 128, "tie_embeddings": False, **FAST_MODEL},
        batch_size=12, seq_len=128, max_steps=3000, warmup_steps=30, lr=3e-3, min_lr=1e-4, schedule="wsd",
        decay_frac=0.3, weight_decay=0.1, beta2=0.99, dtype="fp32", eval_interval=100, eval_batches=16,
        ckpt_interval=3000, log_interval=10, out_dir="runs/shakespeare-char", **FAST,
    )


TRAIN_PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "smoke": _smoke,
    "quickstart": _quickstart,
    "shakespeare-char": _shakespeare_char,
}


def get_train_preset(name: str, **overrides: Any) -> TrainConfig:
    """A fresh TrainConfig for preset `name` with `overrides` (TrainConfig.with_overrides keys) applied."""
    if name not in TRAIN_PRESETS:
        raise ValueError(f"unknown training preset {name!r}; available: {sorted(TRAIN_PRESETS)}")
    config = TRAIN_PRESETS[name]()
    return config.with_overrides(overrides) if overrides else config
