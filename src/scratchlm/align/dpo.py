"""DPO (Rafailov et al. 2023) and its variants, from sequence log-prob SUMS of policy and reference.

With S(y) = sum over completion tokens of log pi(y_t | x, y_<t) (prompt and padding masked out):
    hc = S_theta(y_w) - S_ref(y_w),   hr = S_theta(y_l) - S_ref(y_l),   h = hc - hr
Per pair (then the mean over the batch):
    sigmoid (DPO):  -log sigmoid(beta h)
    hinge (SLiC):   relu(1 - beta h)
    ipo (Azar et al. 2023, Eq. 17):  (h' - 1/(2 beta))^2, h' = hc/|y_w| - hr/|y_l|  (trl's length
                    normalisation, confirmed by the IPO authors but not stated in the paper; pass
                    ipo_length_normalize=False for the sum form)
    cdpo (conservative, label-flip prob eps): -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)
    robust (rDPO, Chowdhury et al. 2024, eps in [0, 0.5)):
                    [ -(1 - eps) log sigmoid(beta h) + eps log sigmoid(-beta h) ] / (1 - 2 eps)
cDPO and rDPO differ in the sign of the flipped term and the 1/(1-2eps) factor. trl >= 0.29 silently
ignores label_smoothing for "sigmoid" (spec §11.5); here cdpo is its own loss type.
Metrics (detached), as trl logs them: rewards/chosen = mean(beta hc), rewards/rejected = mean(beta hr),
rewards/accuracies = mean(1[hc > hr]), rewards/margins = mean(beta (hc - hr)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "cdpo", "robust")


def _check(beta: float, loss_type: str, eps: float) -> None:
    if not beta > 0:
        raise ValueError(f"DPO beta must be > 0, got {beta} (the paper uses 0.1)")
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"DPO loss_type {loss_type!r} is not one of {DPO_LOSS_TYPES}")
    if loss_type == "robust" and not 0 <= eps < 0.5:
        raise ValueError(f"robust DPO needs label_smoothing eps in [0, 0.5), got {eps}")
    if not 0 <= eps <= 1:
        raise ValueError(f"label_smoothing eps must be in [0, 1], got {eps}")


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
    rejected_lengths: torch.Tensor | None = None,
    ipo_length_normalize: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean DPO-family loss over pairs and the metrics dict. Inputs are sequence log-prob sums (B,)."""
    _check(beta, loss_type, label_smoothing)
    hc = policy_chosen - ref_chosen.detach()  # (B,)
    hr = policy_rejected - ref_rejected.detach()
    h = hc - hr
    eps = label_smoothing
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * h)
    elif loss_type == "hinge":
        losses = torch.relu(1.0 - beta * h)
    elif loss_type == "ipo":
        if ipo_length_normalize:
            if chosen_lengths is None or rejected_lengths is None:
                raise ValueError("IPO with length normalisation needs chosen_lengths and rejected_lengths (tokens)")
            h = hc / chosen_lengths.clamp(min=1) - hr / rejected_lengths.clamp(min=1)
        losses = (h - 1.0 / (2.0 * beta)).square()
    elif loss_type == "cdpo":
        losses = -(1.0 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
    else:  # robust
        losses = (-(1.0 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1.0 - 2.0 * eps)
    return losses.mean(), dpo_metrics(hc, hr, beta, policy_chosen, policy_rejected)


@torch.no_grad()
def dpo_metrics(hc: torch.Tensor, hr: torch.Tensor, beta: float, policy_chosen: torch.Tensor,
                policy_rejected: torch.Tensor) -> dict[str, float]:
    """trl's logged DPO metrics (module docstring), as floats."""
    return {
        "rewards/chosen": float((beta * hc).mean()),
        "rewards/rejected": float((beta * hr).mean()),
        "rewards/accuracies": float((hc > hr).float().mean()),
        "rewards/margins": float((beta * (hc - hr)).mean()),
        "logps/chosen": float(policy_chosen.mean()),
        "logps/rejected": float(policy_rejected.mean()),
    }
