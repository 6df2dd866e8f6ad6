"""Sampling-filter distributions vs independently computed kept sets, and the `scratchlm viz` CLI end to end."""

import json

import numpy as np
import pytest
import torch

from scratchlm.model_files import save_model
from scratchlm.cli.main import main
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM
from scratchlm.tokenizer import Tokenizer
from scratchlm.viz.sampling_dist import filtered_distributions

PNG = b"\x89PNG\r\n\x1a\n"


def test_filtered_distributions_renormalise_the_kept_sets() -> None:
    logits = torch.randn(50) * 2
    d = filtered_distributions(logits, temperature=0.7, top_k=5, top_p=0.8, min_p=0.1)
    base = np.exp((logits / 0.7).double().numpy())
    base /= base.sum()
    np.testing.assert_allclose(d["base"].numpy(), base, rtol=1e-5)
    order = np.argsort(-base)
    kept = {
        "top-k=5": set(order[:5]),
        "top-p=0.8": set(order[: int(np.searchsorted(np.cumsum(base[order]), 0.8) + 1)]),
        "min-p=0.1": set(np.nonzero(base >= 0.1 * base.max())[0]),
    }
    for name, keep in kept.items():
        expected = np.zeros_like(base)
        idx = sorted(keep)
        expected[idx] = base[idx] / base[idx].sum()
        np.testing.assert_allclose(d[name].numpy(), expected, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.fixture(scope="module")
def byte_checkpoint(tmp_path_factory):
    """A random 2-layer model with a byte-level tokenizer (no merges), saved like a trained run."""
    directory = tmp_path_factory.mktemp("ckpt")
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|endoftext|>"])
    tok.save(directory)
    save_model(TransformerLM(get_preset("llama-tiny", vocab_size=tok.vocab_size, n_layers=2)), directory)
    metrics = directory / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 5.0 / s, "val_loss": 5.5 / s}) + "\n" for s in range(1, 30)))
    return directory


@pytest.mark.parametrize(
    "argv",
    [
        ["rope-decay", "--max-distance", "32"],
        ["attention", "--checkpoint", "{ckpt}", "--prompt", "to be or not", "--layer", "1"],
        ["loss", "--metrics", "{ckpt}/metrics.jsonl"],
        ["sampling", "--checkpoint", "{ckpt}", "--prompt", "once upon a"],
    ],
    ids=["rope-decay", "attention", "loss", "sampling"],
)
def test_viz_commands_write_pngs(argv, byte_checkpoint, tmp_path) -> None:
    out = tmp_path / "plot.png"
    args = ["viz", *[a.format(ckpt=byte_checkpoint) for a in argv], "--out", str(out)]
    assert main(args) == 0
    assert out.read_bytes()[:8] == PNG


def test_viz_bad_input_is_a_clear_error(byte_checkpoint, tmp_path, capsys) -> None:
    assert main(["viz", "attention", "--checkpoint", str(byte_checkpoint), "--prompt", "hi", "--layer", "9"]) == 2
    assert "--layer 9 is out of range; the model has layers 0..1" in capsys.readouterr().err
    assert main(["viz", "loss", "--metrics", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["viz", "sampling", "--checkpoint", str(byte_checkpoint), "--prompt", "x", "--top-p", "1.5"]) == 2
    assert "top_p=1.5" in capsys.readouterr().err
