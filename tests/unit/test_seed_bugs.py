"""Named regressions for common mistakes in study notes that no other test file isolates.

(The others live next to the code they guard; docs/concepts.md lists them all.)
- KV-cache positions off by one: decoding token t with RoPE position t+1 (or t-1).
- k3 KL with the wrong direction: r = pi/ref instead of ref/pi estimates KL(ref || pi), not KL(pi || ref).
"""

import torch

from scratchlm.align.kl import kl_estimate
from scratchlm.config import get_preset
from scratchlm.model import TransformerLM


def test_kv_cache_positions_off_by_one_are_caught() -> None:
    model = TransformerLM(get_preset("llama-tiny", n_layers=2)).eval()
    ids = torch.randint(0, 1024, (1, 10))
    with torch.no_grad():
        full = model(ids)[:, -1]
        for shift, should_match in ((0, True), (1, False), (-1, False)):
            cache = model.new_kv_cache(1, 16)
            model(ids[:, :9], kv_cache=cache)
            step = model(ids[:, 9:], token_positions=torch.tensor([9 + shift]), kv_cache=cache)[:, -1]
            close = torch.allclose(step, full, atol=1e-5)
            assert close == should_match, f"position shift {shift}"


def test_k3_direction() -> None:
    """E_{y~pi}[k3] must equal KL(pi || ref); the swapped ratio gives a different number."""
    torch.manual_seed(0)
    logpi = torch.log_softmax(torch.randn(8, dtype=torch.float64) * 2, 0)
    logref = torch.log_softmax(torch.randn(8, dtype=torch.float64) * 2, 0)
    pi = logpi.exp()
    reverse_kl = (pi * (logpi - logref)).sum()
    forward_kl = (logref.exp() * (logref - logpi)).sum()
    ours = (pi * kl_estimate(logpi, logref, "k3")).sum()
    swapped = (pi * kl_estimate(logref, logpi, "k3")).sum()  # the mistake: log r = log pi - log ref
    torch.testing.assert_close(ours, reverse_kl, rtol=1e-10, atol=1e-12)
    assert abs(float(swapped - reverse_kl)) > 1e-2 and abs(float(reverse_kl - forward_kl)) > 1e-2
