"""Sharded safetensors with model.safetensors.index.json, both directions, against transformers."""

from __future__ import annotations

import json

import pytest
import torch
from interop_helpers import build_hf, hf_logits, random_ids, safetensors_state
from transformers import AutoModelForCausalLM

import scratchlm
from scratchlm.interop.hf.safetensors_shards import INDEX_NAME, SINGLE_NAME, load_sharded, parse_size, save_sharded


def test_load_hf_sharded_checkpoint(tmp_path):
    hf = build_hf("llama_untied_gqa")
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert len(set(index["weight_map"].values())) > 2 and not (tmp_path / SINGLE_NAME).exists()
    ours = scratchlm.from_pretrained(tmp_path)
    ids = random_ids()
    with torch.no_grad():
        assert (ours(ids) - hf_logits(hf, ids)).abs().max().item() <= 1e-4


def test_save_sharded_loads_in_transformers(tmp_path):
    hf = build_hf("gpt2")
    hf.save_pretrained(tmp_path / "src")
    ours = scratchlm.from_pretrained(tmp_path / "src")
    out = scratchlm.save_pretrained(ours, tmp_path / "out", max_shard_size="30KB")
    index = json.loads((out / INDEX_NAME).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    state = safetensors_state(out)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    assert all(index["weight_map"][k] in shards for k in state) and len(index["weight_map"]) == len(state)
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = random_ids()
    assert torch.equal(hf_logits(reloaded, ids), hf_logits(hf, ids))


def test_resave_unsharded_removes_stale_shards(tmp_path):
    state = {f"t{i}": torch.randn(64, 64) for i in range(4)}  # 16 KiB each
    save_sharded(state, tmp_path, max_shard_size=20_000)
    assert len(list(tmp_path.glob("model-*.safetensors"))) == 4
    (tmp_path / "notes.txt").write_text("kept")
    save_sharded(state, tmp_path, max_shard_size="1MB")
    assert sorted(p.name for p in tmp_path.iterdir()) == [SINGLE_NAME, "notes.txt"]
    loaded = load_sharded(tmp_path)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


@pytest.mark.parametrize("text,expected", [(1000, 1000), ("2GB", 2 * 10**9), ("64KiB", 65536), ("1.5MB", 1_500_000)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "0", -5, "5 parsecs"])
def test_parse_size_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size(bad)


def test_missing_shard_is_a_clear_error(tmp_path):
    build_hf("qwen2").save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        scratchlm.from_pretrained(tmp_path)
