"""PPO for language models: value head, per-token KL reward, GAE, whitening, clipped policy and value losses.

Shapes: B sequences, T completion positions, mask (B, T) = 1 on completion tokens (contiguous from t=0).

Per-token reward (KL in the REWARD, not the loss; Ziegler 2019 / Stiennon 2020 / trl / verl):
    r_t = -kl_coef * KLest_t + [t == last completion token] * score
We place the score on the last valid completion token (verl's choice; trl puts it one past, with a
matching value mask; spec §11.10). KLest is k1 by default (trl, verl) or k3.
GAE (Schulman 2015), backwards with V_{T+1} = 0:
    delta_t = r_t + gamma V_{t+1} - V_t;   A_t = delta_t + gamma lambda A_{t+1};   R_t = A_t + V_t
Whitening over all valid tokens, unbiased variance (trl masked_var):
    A <- (A - mean) / sqrt(var + 1e-8);  shift_mean=False keeps the mean (reward whitening)
Losses (masked means over tokens, 0 for a batch without tokens), rho = exp(logp - old):
    L_pg = masked_mean max(-A rho, -A clip(rho, 1 - eps, 1 + eps))
    L_v  = 0.5 masked_mean max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)
    L    = L_pg + vf_coef L_v
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.align.kl import kl_estimate
from scratchlm.align.logprobs import masked_sum, pack_prompt_completion
from scratchlm.align.surrogate import aggregate_loss, clipped_surrogate
from scratchlm.model import TransformerLM
from scratchlm.nn.linear import Linear


class ValueModel(nn.Module):
    """A critic: a TransformerLM backbone plus a scalar head on its final hidden states (B, T) -> values.

    The hidden state is the LM head's input (captured by a forward pre-hook, so the model code is
    unchanged); the head starts at zero, so V = 0 before training.
    """

    def __init__(self, backbone: TransformerLM) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = Linear(backbone.config.d_model, 1, bias=True)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) -> values (B, T) fp32."""
        captured: list[torch.Tensor] = []
        hook = self.backbone.lm_head.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
        try:
            self.backbone(input_ids)
        finally:
            hook.remove()
        return self.value_head(captured[0]).squeeze(-1).float()  # (B, T, D) -> (B, T)


def ppo_rewards(
    scores: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
    kl_coef: float = 0.05, kl_estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards r (B, T) with the score on the last valid token, and the KL estimate (B, T)."""
    kl = kl_estimate(logp.detach(), ref_logp.detach(), kl_estimator) * mask
    rewards = -kl_coef * kl
    lengths = mask.sum(dim=1).long()  # (B,)
    has = lengths > 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has]
    rewards[rows, lengths[has] - 1] += scores[has].to(rewards.dtype)
    return rewards, kl


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns (B, T) by GAE(gamma, lambda); 0 at masked positions."""
    mask = mask.to(rewards.dtype)
    values = values.detach() * mask
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = (delta + gamma * lam * next_adv) * mask[:, t]
        advantages[:, t] = adv
        next_value, next_adv = values[:, t], adv  # both are 0 past the end (masked)
    return advantages, (advantages + values) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over masked-in entries, unbiased var; masked entries set to 0."""
    n = mask.sum()
    if n < 2:
        raise ValueError(f"whitening needs at least 2 valid tokens, got {int(n)}")
    mean = masked_sum(x, mask) / n
    var = masked_sum((x - mean).square(), mask) / (n - 1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def ppo_policy_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    clip_range: float = 0.2, clip_range_high: float | None = None, dual_clip: float | None = None,
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate aggregated over tokens; metrics: clip fractions and approximate KL(old || new)."""
    ratio = torch.exp(logp - old_logp.detach())
    per_token, low, high = clipped_surrogate(ratio, advantages.detach(), clip_range,
                                             clip_range if clip_range_high is None else clip_range_high, dual_clip)
    loss = aggregate_loss(per_token, mask, agg)
    with torch.no_grad():
        metrics = {"clipfrac": float(aggregate_loss((low | high).float(), mask, "token-mean")),
                   "approx_kl": float(aggregate_loss(0.5 * (logp - old_logp).square(), mask, "token-mean"))}
    return loss, metrics


def ppo_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
    clip_range_value: float = 0.2,
) -> torch.Tensor:
    """0.5 * masked mean of max((V - R)^2, (V_clipped - R)^2)."""
    v_clip = old_values + (values - old_values).clamp(-clip_range_value, clip_range_value)
    per_token = torch.maximum((values - returns).square(), (v_clip - returns).square())
    return 0.5 * aggregate_loss(per_token, mask, "token-mean")


def completion_values(critic: ValueModel, prompts: list[list[int]], completions: list[list[int]]) -> torch.Tensor:
    """V_t for every completion token (B, L): the critic's value at the position that predicts token t
    (the state before emitting it), 0 at padding."""
    ids, index, mask = pack_prompt_completion(prompts, completions)
    device = critic.value_head.weight.device
    values = critic(ids.to(device))  # (B, T)
    return values.gather(1, (index - 1).to(device)) * mask.to(device)
