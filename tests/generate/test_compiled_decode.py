"""The compiled (torch.compile + inductor freezing) decode step equals the eager one, and refuses stale weights."""

from __future__ import annotations

import pytest
import torch

from gen_helpers import build, small_config
from scratchlm.generate import generate
from scratchlm.generate.engine import iter_decode
from scratchlm.generate.sampling import SamplingParams


def test_compiled_decode_equals_eager_and_refuses_changed_weights() -> None:
    model = build(small_config("llama-sdpa").replace(n_layers=1, tie_embeddings=False), scale=3.0)
    prompts = [[5, 9, 2, 77]]
    eager = list(iter_decode(model, prompts, 6, SamplingParams()))
    compiled = list(iter_decode(model, prompts, 6, SamplingParams(), decode="compiled"))
    for (tok_e, logits_e), (tok_c, logits_c) in zip(eager, compiled):
        assert torch.equal(tok_e, tok_c)
        torch.testing.assert_close(logits_c, logits_e, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)  # weights frozen into the compiled graph are now stale
    with pytest.raises(ValueError, match="weights changed"):
        generate(model, prompts, 3, decode="compiled")
    assert len(generate(model, prompts, 3)[0]) == 3  # the eager path is unaffected
