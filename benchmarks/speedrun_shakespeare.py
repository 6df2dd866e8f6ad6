"""CPU speedrun on character-level tinyshakespeare: time to val loss <= 1.88 and val loss after 130 s.

Data: ../shared/data/tinyshakespeare.txt, one token per character (65), first 90% train, last 10% val.
Both runs go through `scratchlm.train` with a 130 s budget (the schedule is sized from the measured
step time) and evaluate every `eval_interval` steps on a fixed val subset; the final model is also
scored on the whole val split. Losses are nats per character.
- baseline: the classic GPT-2-style recipe (4 layers, D 128, 4 heads, T 64, B 12, lr 1e-3, fp32,
  learned positions, LayerNorm, GELU MLP, cosine over 2000 iters).
- ours: the `shakespeare-char` preset (llama-style: RoPE, RMSNorm, SwiGLU; bf16 autocast; WSD schedule).
Prints one JSON object.   python benchmarks/speedrun_shakespeare.py [--budget 130] [--skip-baseline] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from scratchlm.data.batches import iter_epoch
from scratchlm.data.token_file import write_token_file
from scratchlm.model_files import load_model
from scratchlm.train.train_config import TrainConfig
from scratchlm.train.losses import cross_entropy
from scratchlm.train.loop import train
from scratchlm.train.run_metrics import MetricsLog
from scratchlm.train.presets import get_train_preset

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"
TARGET = 1.88

BASELINE = dict(
    model_preset="gpt2-tiny", model={"d_model": 128, "n_layers": 4, "n_heads": 4, "max_seq_len": 64, "attn_impl": "sdpa"},
    batch_size=12, seq_len=64, max_steps=2000, warmup_steps=100, lr=1e-3, min_lr=1e-4, schedule="cosine",
    beta2=0.99, weight_decay=0.1, dtype="fp32", eval_interval=100, eval_batches=20, ckpt_interval=2000,
    optimizer_impl="torch", loss_impl="torch",
)


def char_token_files(root: Path) -> tuple[Path, Path]:
    """train.bin / val.bin: character ids (sorted alphabet), split 90/10."""
    text = DATA.read_text(encoding="utf-8")
    alphabet = sorted(set(text))
    ids = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    lut = {ord(c): i for i, c in enumerate(alphabet)}
    tokens = np.array([lut[int(c)] for c in ids], dtype=np.int64)
    cut = int(len(tokens) * 0.9)
    write_token_file(root / "train.bin", [tokens[:cut]], len(alphabet))
    write_token_file(root / "val.bin", [tokens[cut:]], len(alphabet))
    return root / "train.bin", root / "val.bin"


@torch.no_grad()
def full_val_loss(checkpoint: Path, val_path: Path, seq_len: int) -> float:
    """Mean loss per character over every non-overlapping window of the val split (fp32)."""
    from scratchlm.data.token_file import open_token_file

    model = load_model(checkpoint).eval()
    total, count = 0.0, 0
    for x, y in iter_epoch(open_token_file(val_path), 64, seq_len):
        total += float(cross_entropy(model(x), y, reduction="sum", impl="torch"))
        count += y.numel()
    return total / count


def run(name: str, cfg: TrainConfig, val_path: Path, budget: float) -> dict:
    t0 = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - t0
    records = MetricsLog(Path(cfg.out_dir) / "metrics.jsonl").read()
    vals = [(r["elapsed_s"], r["val_loss"]) for r in records if "val_loss" in r]
    hit = next((t for t, v in vals if v <= TARGET), None)
    within = [v for t, v in vals if t <= budget * 1.05]  # the final eval starts right after the step that hit it
    last = [r for r in records if "loss" in r][-1]
    return {"name": name, "time_to_1_88_s": hit, "val_loss_at_130s": round(min(within), 4) if within else None,
            "full_val_loss_final": round(full_val_loss(result.checkpoint, val_path, cfg.seq_len), 4),
            "steps": result.step, "tok_s_last": last["tok_s"], "wall_s": round(wall, 1),
            "val_curve": [(round(t, 1), round(v, 4)) for t, v in vals]}


def _value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=130.0)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="torch threads for both runs (0 = torch default)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override our preset")
    args = ap.parse_args()
    overrides = {k: _value(v) for k, _, v in (s.partition("=") for s in args.set)}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train_path, val_path = char_token_files(root)
        common = dict(train_data=str(train_path), val_data=str(val_path), max_time_s=args.budget, progress=False,
                      num_threads=args.threads)
        ours_cfg = get_train_preset("shakespeare-char", out_dir=str(root / "ours"), **common, **overrides)
        runs = [run("ours", ours_cfg, val_path, args.budget)]
        if not args.skip_baseline:
            base_cfg = TrainConfig(**BASELINE, out_dir=str(root / "baseline"), **common)
            runs.append(run("baseline", base_cfg, val_path, args.budget))
    ours = runs[0]
    out = {"benchmark": "speedrun_shakespeare", "budget_s": args.budget, "threads": torch.get_num_threads(),
           "time_to_1_88_s": ours["time_to_1_88_s"], "val_loss_at_130s": ours["val_loss_at_130s"], "runs": runs}
    if len(runs) > 1 and runs[1]["val_loss_at_130s"]:
        out["baseline_val_loss_at_130s"] = runs[1]["val_loss_at_130s"]
        out["baseline_time_to_1_88_s"] = runs[1]["time_to_1_88_s"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
