"""The GRPO family against trl 1.16's own `GRPOTrainer._compute_loss` on fixed inputs: loss, gradient and
logged clip/KL metrics, for every aggregation, token and sequence (GSPO) ratios, beta with and without
the KL importance correction, and clip ranges below and above 1.

trl's method runs on a stub `self` that supplies only what the loss reads (the model forward is
replaced by our fixed per-token log-probs), so the reference is trl's code itself, not a re-derivation.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from collections import defaultdict

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo  # pinned in the test extra (trl==1.16.0): a plain import, never skipped

from scratchlm.align.grpo import GRPOLossConfig, grpo_loss

# trl loss_type -> our aggregation (trl's "dapo" normaliser is the generation batch's token count)
AGG = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm",
       "dapo": "token-mean"}
MAX_LEN = 6


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def autocast(self):
        return contextlib.nullcontext()


def _trl_stub(loss_type: str, level: str, beta: float, eps: tuple[float, float], bias_kl: bool, logp: torch.Tensor):
    s = types.SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level=level, beta=beta,
        args=types.SimpleNamespace(use_bias_correction_kl=bias_kl, delta=None, steps_per_generation=1),
        loss_type=loss_type, epsilon_low=eps[0], epsilon_high=eps[1], use_vllm=False,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=MAX_LEN, accelerator=_Accelerator(), _entropy_bonus_enabled=False,
        aux_loss_enabled=False, _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    s._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    return s


def _inputs(mask: torch.Tensor, adv, old, ref) -> dict:
    b, t = mask.shape
    return {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1),
            "completion_ids": torch.zeros(b, t, dtype=torch.long), "completion_mask": mask, "advantages": adv,
            "old_per_token_logps": old, "ref_per_token_logps": ref, "num_items_in_batch": mask.sum()}


def _case(seed: int, empty_row: bool):
    g = torch.Generator().manual_seed(seed)
    base = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 3
    old = base + 0.4 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    ref = base + 0.4 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float64)
    if empty_row:
        mask[2] = 0
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    return base, old, ref, mask, adv


CASES = [c for c in itertools.product(["grpo", "bnpo", "dr_grpo", "dapo"], ["token", "sequence"], [0.0, 0.04],
                                      [True, False], [(0.2, 0.28), (1.5, 3.0)])
         if c[2] > 0 or c[3]]  # the KL correction is irrelevant at beta = 0


@pytest.mark.parametrize("loss_type,level,beta,bias_kl,eps", CASES)
def test_loss_gradient_and_metrics_equal_trl(loss_type, level, beta, bias_kl, eps):
    for empty_row in (False, True):
        base, old, ref, mask, adv = _case(7, empty_row)
        lp_trl = base.clone().requires_grad_(True)
        stub = _trl_stub(loss_type, level, beta, eps, bias_kl, lp_trl)
        want = trl_grpo.GRPOTrainer._compute_loss(stub, None, _inputs(mask, adv, old, ref))
        want.backward()

        cfg = GRPOLossConfig(importance_level=level, loss_agg=AGG[loss_type], beta=beta, kl_is_correction=bias_kl,
                             clip_low=eps[0], clip_high=eps[1], max_completion_length=MAX_LEN)
        lp = base.clone().requires_grad_(True)
        got, m = grpo_loss(lp, old, adv, mask, cfg, ref_logp=ref, num_tokens=float(mask.sum()))
        got.backward()
        assert got.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-14)
        torch.testing.assert_close(lp.grad, lp_trl.grad, rtol=1e-12, atol=1e-14)
        metrics = stub._metrics["train"]
        if beta > 0:
            assert m["kl"] == pytest.approx(metrics["kl"][0], rel=1e-12)
        if not empty_row:  # trl counts an empty sequence in the sequence-level clip fraction; we skip it
            assert m["clip_low_frac"] == pytest.approx(metrics["clip_ratio/low_mean"][0], abs=1e-15)
            assert m["clip_high_frac"] == pytest.approx(metrics["clip_ratio/high_mean"][0], abs=1e-15)


def test_cases_exercise_clipping_on_both_sides():
    """The fixed inputs above are only a real check if some tokens clip low and some clip high."""
    base, old, ref, mask, adv = _case(7, False)
    _, m = grpo_loss(base, old, adv, mask, GRPOLossConfig(clip_low=0.2, clip_high=0.28, beta=0.0))
    assert m["clip_low_frac"] > 0 and m["clip_high_frac"] > 0
    _, s = grpo_loss(base, old, adv, mask, GRPOLossConfig(importance_level="sequence", clip_low=0.05,
                                                          clip_high=0.05, beta=0.0))
    assert s["clip_low_frac"] + s["clip_high_frac"] > 0
