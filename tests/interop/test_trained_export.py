"""A model pretrained with `scratchlm train` exports with `scratchlm convert --to-hf` and transformers
reproduces its logits (Llama-style and GPT-2-style architectures)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from scratchlm.model_files import load_model
from scratchlm.cli.main import main
from scratchlm.data.token_file import write_token_file

ARCHS = {
    "llama": ["--model_preset=llama-tiny", "--model.tie_embeddings=false", "--model.qkv_bias=true",
              "--model.n_kv_heads=2"],
    "gpt2": ["--model_preset=gpt2-tiny", "--model.n_kv_heads=4"],  # the smoke preset sets GQA; GPT-2 is MHA
}


@pytest.fixture(scope="module")
def shakespeare_bytes(shared_data, tmp_path_factory):
    """Byte-level token file (vocab 256) of the first 60 kB of tinyshakespeare."""
    ids = np.frombuffer((shared_data / "tinyshakespeare.txt").read_bytes()[:60_000], dtype=np.uint8)
    path = tmp_path_factory.mktemp("data") / "shk.bin"
    write_token_file(path, [ids.astype(np.int64)], 256)
    return path


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_trained_model_exports_with_identical_logits(shakespeare_bytes, tmp_path, arch):
    run, hf_dir = tmp_path / "run", tmp_path / "hf"
    args = ["train", "--preset", "smoke", f"--train_data={shakespeare_bytes}", f"--out_dir={run}",
            "--max_steps=12", "--warmup_steps=2", "--eval_interval=12", "--eval_batches=1", "--ckpt_interval=12",
            "--log_interval=4", "--batch_size=4", "--seq_len=32", "--peak_gflops=1", "--progress=false",
            "--model.d_model=64", "--model.n_layers=2", "--model.n_heads=4", "--model.max_seq_len=64",
            "--model.attn_impl=reference", *ARCHS[arch]]
    assert main(args) == 0
    losses = [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(losses) >= 3 and losses[-1] < losses[0] - 0.5  # it really trained
    trained = load_model(run / "checkpoint").eval()

    assert main(["convert", "--to-hf", str(run / "checkpoint"), "--out", str(hf_dir)]) == 0
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert hf.config.model_type == ("gpt2" if arch == "gpt2" else "qwen2")
    ids = torch.tensor(np.frombuffer(b"First Citizen:\nBefore we proceed any further", dtype=np.uint8)).long()[None]
    with torch.no_grad():
        ours, theirs = trained(ids), hf(ids).logits
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
