"""A model's next-token cross entropy through one of the loss paths (`loss_impl`).

    reference, torch   logits = model(ids) (B, T, V), then train/losses.py's cross_entropy (ours / F.cross_entropy)
    chunked            h = model(ids, return_hidden=True) (B, T, D), then train/chunked_ce.py's head + cross
                       entropy over chunks of positions: no (B, T, V) logits tensor
The chunked path needs a plain bias-free LM head and no final soft-capping (Gemma-2/3); logits_scaling s is
folded into h (h W^T / s = (h / s) W^T). Any other head, and reduction="none", falls back to "torch".
"""

from __future__ import annotations

import torch
from torch import nn

from scratchlm.nn.linear import Linear
from scratchlm.train.chunked_ce import linear_cross_entropy
from scratchlm.train.losses import LOSS_IMPLS, cross_entropy

LM_LOSS_IMPLS = LOSS_IMPLS + ("chunked",)


def fused_head_weight(model: nn.Module) -> torch.Tensor | None:
    """The (V, D) weight the chunked path multiplies by, or None when the head cannot be fused."""
    head, config = getattr(model, "lm_head", None), getattr(model, "config", None)
    if type(head) is not Linear or head.bias is not None or config is None or config.final_softcap is not None:
        return None
    return head.weight


def model_cross_entropy(model: nn.Module, input_ids: torch.Tensor, targets: torch.Tensor, impl: str = "reference",
                        label_smoothing: float = 0.0, z_loss: float = 0.0, reduction: str = "mean",
                        ignore_index: int = -100, drop_last: bool = False,
                        return_router_logits: bool = False, raw_model: nn.Module | None = None,
                        ) -> torch.Tensor | tuple[torch.Tensor, tuple]:
    """Cross entropy of targets under model(input_ids). input_ids (B, T); targets (B, T), or (B, T - 1) with
    drop_last (the last position predicts nothing: SFT's shifted labels). return_router_logits: also the MoE
    router logits (model.forward's). raw_model: the TransformerLM inside a DDP wrapper `model`."""
    if impl not in LM_LOSS_IMPLS:
        raise ValueError(f"loss impl={impl!r} is not one of {LM_LOSS_IMPLS}")
    weight = fused_head_weight(raw_model or model) if impl == "chunked" and reduction != "none" else None
    out = model(input_ids, return_router_logits=return_router_logits, return_hidden=weight is not None)
    x, router = out if return_router_logits else (out, None)
    if drop_last:
        x = x[:, :-1]
    if weight is None:
        loss = cross_entropy(x, targets, ignore_index, label_smoothing, z_loss, reduction,
                             "torch" if impl == "chunked" else impl)
    else:
        config = (raw_model or model).config
        scaling = config.logits_scaling
        loss = linear_cross_entropy(x if scaling == 1.0 else x / scaling, weight, targets, ignore_index,
                                    label_smoothing, z_loss, reduction, fused=config.fused_ops)
    return (loss, router) if return_router_logits else loss
