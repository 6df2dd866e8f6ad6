"""`scratchlm train` on the new architecture features: a sliding-window model, a Gemma-2-style soft-capped
model and a mixture of experts (with its load-balancing loss) train (the loss falls) and resume
bit-identically (one torch thread)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from scratchlm.cli.main import main
from scratchlm.train import loop
from tests.train.conftest import make_tokens

MODELS = {
    "sliding_window": {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]},
    "softcapped": {"attn_softcap": 5.0, "final_softcap": 8.0, "norm_placement": "sandwich", "norm_unit_offset": True,
                   "ffn": "glu", "activation": "gelu_tanh", "embedding_multiplier": 5.66, "qk_norm": True},
    "moe": {"moe_num_experts": 4, "moe_top_k": 2, "moe_d_ff": 48, "moe_shared_d_ff": 16, "moe_impl": "grouped",
            "moe_aux_loss_coef": 0.05},
}


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def _losses(run_dir) -> dict[int, float]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _args(tokens: str, out, model: dict, *extra: str) -> list[str]:
    args = ["train", "--preset", "smoke", f"--train_data={tokens}", f"--out_dir={out}", "--max_steps=14",
            "--warmup_steps=2", "--lr=1e-2", "--batch_size=4", "--seq_len=16", "--eval_interval=7",
            "--eval_batches=1", "--ckpt_interval=7", "--log_interval=1", "--progress=false", "--peak_gflops=1",
            "--model.d_model=32", "--model.n_layers=2", "--model.n_heads=2", "--model.n_kv_heads=1",
            "--model.max_seq_len=16", "--model.ops_impl=reference", "--model.attn_impl=sdpa"]
    return args + [f"--model.{k}={json.dumps(v)}" for k, v in model.items()] + list(extra)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_feature_model_trains_and_resumes_bit_identically(tmp_path, name):
    tokens = make_tokens(tmp_path / "train.bin")
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(_args(tokens, full, MODELS[name])) == 0
    assert main(_args(tokens, part, MODELS[name], "--stop_at_step=7")) == 0
    assert main(["train", "--resume", f"--out_dir={part}", "--stop_at_step=0"]) == 0
    losses = _losses(full)
    assert _losses(part) == losses  # exact float equality over steps 1..14
    assert sum(losses[i] for i in (13, 14)) < 0.9 * sum(losses[i] for i in (1, 2))
    a, b = (load_file(str(d / "checkpoint" / "model.safetensors")) for d in (full, part))
    assert all(torch.equal(a[k], b[k]) for k in a)
    config = json.loads((full / "checkpoint" / "config.json").read_text())
    assert all(config[k] == (tuple(v) if isinstance(v, list) else v) or config[k] == v for k, v in MODELS[name].items())


def test_moe_training_loss_adds_the_load_balancing_term(tmp_path, monkeypatch):
    """The optimised loss is CE + coef * aux (aux from the forward's router logits); validation is CE alone."""
    tokens = make_tokens(tmp_path / "train.bin")
    seen = []
    real = loop.load_balancing_loss

    def spy(router_logits, top_k):
        value = real(router_logits, top_k)
        seen.append((len(router_logits), tuple(router_logits[0].shape), top_k, float(value)))
        return value

    monkeypatch.setattr(loop, "load_balancing_loss", spy)
    assert main(_args(tokens, tmp_path / "run", MODELS["moe"], "--max_steps=2", "--model.moe_dense_layers=[1]")) == 0
    assert seen and all(s[:3] == (1, (4 * 16, 4), 2) and s[3] >= 2.0 for s in seen)  # one MoE layer, k = 2
