"""Per-token log-probs of a completion given a prompt, masked reductions and entropy.

Shapes: B sequences, T positions, V vocabulary, L = longest completion in the batch.

Log-probs at temperature tau (the sampler's temperature, so that pi_old used for sampling and the
pi_theta we score agree at step 0, spec §3 / §11.13):
    z = logits / tau,   lse = m + log sum_v exp(z_v - m),  m = max_v z_v
    logp(y) = z_y - lse                              (fp32, stable)
    H = lse - sum_v p_v z_v,   p = softmax(z)        (entropy of the tempered distribution)
The logits at position t predict token t + 1, so completion token j of row b (absolute index
s = P_b + j with P_b prompt tokens) is scored from logits[b, s - 1].

Masked reductions over a token mask m (1 = counts; masked-out entries are never read, so a NaN or
inf in a padded slot cannot leak in):
    masked_sum       = sum_t m_t z_t
    masked_mean      = sum_t m_t z_t / sum_t m_t    torch semantics: NaN where the slice has no tokens,
                                                    as torch.mean of an empty tensor (the loss
                                                    aggregators in surrogate.py handle empty rows explicitly)
    masked_normalize = sum_t m_t z_t / c            a constant normaliser c (Dr. GRPO, masked-sum SFT)

Model-agnostic entry point: `response_log_probs(model, input_ids, labels)` runs any causal LM that maps
(B, T) ids to logits (B, T, V) — a TransformerLM, or a transformers model whose output has `.logits`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


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
    """sum of x where mask is nonzero (over `dim`, or everything when dim is None)."""
    x = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() if dim is None else x.sum(dim=dim)


def mask_count(mask: torch.Tensor, dim: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Number of masked-in entries (over `dim`, or all)."""
    m = mask.bool().to(dtype)
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """masked_sum / number of masked-in entries; NaN where there are none (torch.mean semantics)."""
    return masked_sum(x, mask, dim) / mask_count(mask, dim, x.dtype)


def masked_normalize(x: torch.Tensor, mask: torch.Tensor, normalize_constant: float,
                     dim: int | None = None) -> torch.Tensor:
    """masked_sum / normalize_constant (a constant, not the token count)."""
    if not normalize_constant > 0:
        raise ValueError(f"normalize_constant must be > 0, got {normalize_constant}")
    return masked_sum(x, mask, dim) / normalize_constant


def logits_of(output: Any) -> torch.Tensor:
    """The (B, T, V) logits of a causal LM's forward: the tensor itself, or `output.logits` (transformers)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"the model returned {type(output).__name__}, neither logits nor an object with .logits")
    return logits


def response_log_probs(
    model: Callable[[torch.Tensor], Any], input_ids: torch.Tensor, labels: torch.Tensor,
    return_token_entropy: bool = False, temperature: float = 1.0, ignore_index: int = -100,
) -> dict[str, torch.Tensor]:
    """log pi(labels_t | input_ids_<=t) of any causal LM, (B, T) -> {"log_probs": (B, T)} (+ "token_entropy").

    labels are input_ids shifted left by one (align.prompt_output.tokenize_prompt_and_output builds both);
    positions whose label is ignore_index get log-prob 0. Gradient flows unless under no_grad.
    """
    if labels.shape != input_ids.shape:
        raise ValueError(f"labels {tuple(labels.shape)} must have the shape of input_ids {tuple(input_ids.shape)}")
    logits = logits_of(model(input_ids))  # (B, T, V)
    keep = labels != ignore_index
    logp = token_logprobs(logits, labels.masked_fill(~keep, 0), temperature)
    out = {"log_probs": logp.masked_fill(~keep, 0.0)}
    if return_token_entropy:
        out["token_entropy"] = entropy(logits, temperature)
    return out


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


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (works for any nn.Module, ours or transformers')."""
    return next(model.parameters()).device


def completion_logprobs(
    model: Callable[[torch.Tensor], Any],
    prompts: list[list[int]],
    completions: list[list[int]],
    temperature: float = 1.0,
    pad_id: int = 0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log pi(y_j | x, y_<j) for every completion token (gradient flows unless under no_grad).

    Returns logp (B, L) and mask (B, L) (and the per-token entropy (B, L) when with_entropy), with 0 at
    padded positions. The model (any causal LM, see logits_of) runs once on the right-padded
    prompt + completion rows.
    """
    ids, index, mask = pack_prompt_completion(prompts, completions, pad_id)
    device = model_device(model)
    ids, index, mask = ids.to(device), index.to(device), mask.to(device)
    logits = logits_of(model(ids))  # (B, T, V)
    pred = logits.gather(1, (index - 1).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # (B, L, V)
    targets = ids.gather(1, index)  # (B, L)
    logp = token_logprobs(pred, targets, temperature) * mask
    if with_entropy:
        return logp, mask, entropy(pred, temperature) * mask
    return logp, mask


def sequence_logprobs(
    model: Callable[[torch.Tensor], Any], prompts: list[list[int]], completions: list[list[int]],
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """S(y) = sum_j logp_j over completion tokens (a SUM, as DPO needs), and the token counts. -> (B,), (B,)."""
    logp, mask = completion_logprobs(model, prompts, completions, temperature)
    return masked_sum(logp, mask, dim=1), mask.sum(dim=1)
