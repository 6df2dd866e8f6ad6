"""Per-token log-probs of a completion given a prompt, masked reductions and entropy.

Shapes: B sequences, T positions, V vocabulary, L = longest completion in the batch.

Log-probs at temperature tau (the sampler's temperature, so that pi_old used for sampling and the
pi_theta we score agree at step 0, spec §3 / §11.13):
    z = logits / tau,   lse = m + log sum_v exp(z_v - m),  m = max_v z_v
    logp(y) = z_y - lse                              (fp32, stable)
    H = lse - sum_v p_v z_v,   p = softmax(z)        (entropy of the tempered distribution)
The logits at position t predict token t + 1, so completion token j of row b (absolute index
s = P_b + j with P_b prompt tokens) is scored from logits[b, s - 1].

Masked reductions over a token mask m (1 = counts):
    masked_sum  = sum_t m_t z_t
    masked_mean = sum_t m_t z_t / sum_t m_t      (0, not NaN, where a row has no tokens)
"""

from __future__ import annotations

import torch

from scratchlm.model import TransformerLM


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to score log-probs, got {temperature} (greedy has no density)")
    z = logits.float()
    return z if temperature == 1.0 else z / temperature


def _lse(z: torch.Tensor) -> torch.Tensor:
    """log sum_v exp(z_v) over the last dim, shifted by the (detached) max. (..., V) -> (...)."""
    m = z.amax(dim=-1, keepdim=True).detach()
    return (z - m).exp().sum(dim=-1).log() + m.squeeze(-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[target] per position. logits (..., V), targets (...) -> (...) fp32."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be targets.shape {tuple(targets.shape)} + (V,)")
    z = _tempered(logits, temperature)
    return z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1) - _lse(z)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature): H = lse - sum_v p_v z_v. (..., V) -> (...) fp32."""
    z = _tempered(logits, temperature)
    lse = _lse(z)
    p = (z - lse.unsqueeze(-1)).exp()
    return lse - (p * z).sum(dim=-1)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum of x where mask is 1 (over `dim`, or everything when dim is None)."""
    x = x * mask.to(x.dtype)
    return x.sum() if dim is None else x.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """masked_sum / number of masked-in entries; 0 where there are none (a fully masked row)."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def pack_prompt_completion(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows prompt + completion and the gather layout of the completion tokens.

    Returns ids (B, T), index (B, L) = absolute position of completion token j in its row (clamped for
    padding) and mask (B, L) (1 on real completion tokens). Right padding needs no attention mask:
    under causal attention a real token never sees the pads that follow it.
    """
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"need one completion per prompt, got {len(prompts)} prompts, {len(completions)} completions")
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty; the first completion token needs at least one prompt token")
    t = max(len(p) + len(c) for p, c in zip(prompts, completions))
    length = max(1, max(len(c) for c in completions))
    ids = torch.full((len(prompts), t), pad_id, dtype=torch.long)
    index = torch.zeros(len(prompts), length, dtype=torch.long)
    mask = torch.zeros(len(prompts), length)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        ids[b, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        index[b] = (len(p) + torch.arange(length)).clamp(max=t - 1)
        mask[b, : len(c)] = 1.0
    return ids, index, mask


def completion_logprobs(
    model: TransformerLM,
    prompts: list[list[int]],
    completions: list[list[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log pi(y_j | x, y_<j) for every completion token (gradient flows unless under no_grad).

    Returns logp (B, L) and mask (B, L) (and the per-token entropy (B, L) when with_entropy), with 0 at
    padded positions. The model runs once on the right-padded prompt + completion rows.
    """
    ids, index, mask = pack_prompt_completion(prompts, completions, pad_id)
    device = model.lm_head.weight.device
    ids, index, mask = ids.to(device), index.to(device), mask.to(device)
    logits = model(ids)  # (B, T, V)
    pred = logits.gather(1, (index - 1).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # (B, L, V)
    targets = ids.gather(1, index)  # (B, L)
    logp = token_logprobs(pred, targets, temperature) * mask
    if with_entropy:
        return logp, mask, entropy(pred, temperature) * mask
    return logp, mask


def sequence_logprobs(
    model: TransformerLM, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """S(y) = sum_j logp_j over completion tokens (a SUM, as DPO needs), and the token counts. -> (B,), (B,)."""
    logp, mask = completion_logprobs(model, prompts, completions, temperature)
    return masked_sum(logp, mask, dim=1), mask.sum(dim=1)
