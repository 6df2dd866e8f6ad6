"""prefill="bf16": all but the last prompt token through a bf16 copy of the model (its cache widened into
the model's cache), the last token through the model itself.

Reference: the same model cast to bf16 (torch's own .to(bfloat16)) run on a bf16 cache: the cache slots
must be exactly what that forward produces, and the logits exactly the fp32 model's last-token forward
on that cache; against the all-fp32 prefill they differ only by the cache's bf16 rounding (bounded).
"""

from __future__ import annotations

import copy

import pytest
import torch

from gen_helpers import build, small_config
from scratchlm.generate import generate
from scratchlm.generate.prefill import bf16_copy, prefill


def test_bf16_prefill_is_the_bf16_models_forward_then_the_last_token_in_fp32(one_torch_thread) -> None:
    model = build(small_config("llama-gqa-half").replace(tie_embeddings=False), scale=2.0)
    ref = copy.deepcopy(model).to(torch.bfloat16)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9).expand(2, 9)
    cache, ref_cache = model.new_kv_cache(2, 16), ref.new_kv_cache(2, 16)
    with torch.no_grad():
        got = prefill(model, ids, pos, None, cache, "bf16")
        ref(ids[:, :8], pos[:, :8], None, ref_cache)  # the first 8 tokens: torch's own bf16 cast of the model
        assert torch.equal(cache.k[:, :, :, :8], ref_cache.k[:, :, :, :8].float())
        assert torch.equal(cache.v[:, :, :, :8], ref_cache.v[:, :, :, :8].float())
        widened = model.new_kv_cache(2, 16)
        widened.k[:, :, :, :8], widened.v[:, :, :, :8] = ref_cache.k[:, :, :, :8], ref_cache.v[:, :, :, :8]
        widened.seq_len = 8
        want = model(ids[:, 8:], pos[:, 8:], None, widened, logits_to_keep=1)[:, -1]  # the last token in fp32
        exact = model(ids, pos, None, model.new_kv_cache(2, 16), logits_to_keep=1)[:, -1]
    assert got.dtype == torch.float32 and cache.seq_len == 9
    assert torch.equal(got, want)
    assert torch.equal(cache.k[:, :, :, 8], widened.k[:, :, :, 8])
    assert (got - exact).abs().max() <= 0.02 * exact.abs().max()  # bf16 rounding of the cache only


def test_bf16_prefill_continues_a_filled_cache_and_copy_is_cached(one_torch_thread) -> None:
    model = build(small_config("llama-mha").replace(tie_embeddings=False), scale=2.0)
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    one, two = model.new_kv_cache(1, 16), model.new_kv_cache(1, 16)
    with torch.no_grad():
        whole = prefill(model, ids, torch.arange(10)[None], None, one, "bf16")
        prefill(model, ids[:, :6], torch.arange(6)[None], None, two, "bf16")
        rest = prefill(model, ids[:, 6:], torch.arange(6, 10)[None], None, two, "bf16")
    assert two.seq_len == 10
    assert (rest - whole).abs().max() <= 0.02 * whole.abs().max()
    assert bf16_copy(model) is bf16_copy(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)
    assert bf16_copy(model).lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(bf16_copy(model).lm_head.weight, model.lm_head.weight.bfloat16())


def test_engine_prefill_switch_and_bad_mode(one_torch_thread) -> None:
    model = build(small_config("llama-gqa-half").replace(tie_embeddings=False), scale=3.0)
    prompts = [[5, 9, 2, 77, 31], [40, 3]]
    out = generate(model, prompts, 6, decode="fast", prefill="bf16")
    ref = generate(model, prompts, 6, decode="fast")
    assert [len(r) for r in out] == [6, 6] and out[0][0] == ref[0][0]
    with pytest.raises(ValueError, match="unknown prefill mode 'fp8'"):
        generate(model, prompts, 2, prefill="fp8")
