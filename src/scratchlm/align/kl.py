"""KL estimators k1, k2, k3 (Schulman 2020) for KL(pi_theta || pi_ref) from tokens sampled by the policy.

Per token, with log r = ref - logp (ref = log pi_ref, logp = log pi_theta):
    k1 = -log r               = logp - ref                       unbiased, high variance, can be < 0
    k2 = 0.5 (log r)^2                                           biased, low variance, >= 0
    k3 = (r - 1) - log r      = exp(ref - logp) - (ref - logp) - 1   unbiased, low variance, >= 0
All three estimate the REVERSE KL E_{y~pi_theta}[log pi_theta / pi_ref].

Gradient caveat (spec §1, tested by exact enumeration in tests/align/test_kl.py): used as a LOSS
with on-policy samples,
    E[grad k1] = 0,   E[grad k2] = grad KL(pi_theta || pi_ref),   E[grad k3] = grad KL(pi_ref || pi_theta)
(the forward KL!). Multiplying by the differentiable importance ratio rho = exp(logp - sg[logp_old])
(value 1 on-policy) makes k1 * rho and k3 * rho give grad KL(pi_theta || pi_ref).
`kl_is_correction=True` applies that ratio (trl 1.16's `use_bias_correction_kl=True`, its default;
the DeepSeekMath paper's literal objective is `False`, our default).
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3",
                clamp: float | None = None) -> torch.Tensor:
    """Per-token k1/k2/k3 (module docstring). clamp: optional bound on |log r| (verl clamps k3's at 20)."""
    log_r = ref_logp - logp
    if clamp is not None:
        log_r = log_r.clamp(-clamp, clamp)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        return log_r.exp() - log_r - 1.0
    raise ValueError(f"kl estimator {estimator!r} is not one of {KL_ESTIMATORS}")


def kl_loss_term(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    estimator: str = "k3",
    old_logp: torch.Tensor | None = None,
    is_correction: bool = False,
    ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL term for a loss: k(logp, ref), times the importance ratio when is_correction.

    The ratio is `ratio` when given (the surrogate's own: GSPO's (B, 1) sequence ratio weights every
    token of its sequence, as trl 1.16 does), else rho = exp(logp - sg[old]) per token; old_logp
    defaults to logp itself (on-policy: rho has value 1 but still carries grad log pi).
    """
    k = kl_estimate(logp, ref_logp.detach(), estimator)
    if not is_correction:
        return k
    if ratio is None:
        old = (logp if old_logp is None else old_logp).detach()
        ratio = torch.exp(logp - old)
    return ratio * k
