"""LoRA: low-rank adapters on chosen linear layers (Hu et al. 2021, arXiv 2106.09685).

A frozen Linear W (out, in) gets a trainable low-rank update of rank r:
    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,     A (r, in), B (out, r)
A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform with a = sqrt(5), as PEFT initialises lora_A) and B = 0,
so the adapted model starts exactly equal to the base model. Only A and B train.
merge():   W <- W + (alpha / r) B A      (the adapter folded into the weight; forward skips the branch)
unmerge(): W <- W - (alpha / r) B A      (exact up to floating-point rounding)
QLoRA: the base may be a BlockLinear (a GGUF matrix kept in its ggml blocks, nn/block_linear.py): the
adapters train in fp32 on top of the frozen quantized base, the backward pass reaching x through
dequantized tiles. Such a base cannot change in place: merge_lora replaces it with a dense Linear
holding dequantize(W) + (alpha / r) B A.
Dropout (inverted): during training x_i is zeroed with probability p and the survivors scaled by
1 / (1 - p); the base path always sees the undropped x.

Parameter names follow PEFT's layout under our HF-style names: `...q_proj.base_layer.weight`,
`...q_proj.lora_A.weight`, `...q_proj.lora_B.weight` (interop/hf/peft_adapter.py adds PEFT's
`base_model.model.` prefix when saving). Shapes: x (..., in) -> y (..., out).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from scratchlm.nn.block_linear import BlockLinear
from scratchlm.nn.linear import Linear

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def inverted_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """x * keep / (1 - p), keep ~ Bernoulli(1 - p) elementwise; identity when not training or p = 0."""
    if not training or p == 0.0:
        return x
    keep = (torch.rand_like(x) >= p).to(x.dtype)
    return x * keep / (1.0 - p)


class LoRALinear(nn.Module):
    """A frozen `base_layer` plus the trainable update (alpha / r) B A (module docstring)."""

    def __init__(self, base_layer: Linear | BlockLinear, r: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(r, int) or r < 1:
            raise ValueError(f"LoRA rank r must be an integer >= 1, got {r!r}")
        cap = min(base_layer.in_features, base_layer.out_features)
        if r > cap:
            raise ValueError(f"LoRA rank r={r} exceeds min(in, out)={cap} of the layer it adapts; lower --lora-r")
        if not alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {alpha}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {dropout}")
        self.base_layer = base_layer
        for p in base_layer.parameters():
            p.requires_grad_(False)
        if isinstance(base_layer, BlockLinear):  # QLoRA: fp32 adapters on the quantized base
            device, dtype = base_layer.data.device, torch.float32
        else:
            device, dtype = base_layer.weight.device, base_layer.weight.dtype
        fused = getattr(base_layer, "fused", False)  # the base's product path (nn/linear.py)
        self.lora_A = Linear(base_layer.in_features, r, fused=fused).to(device=device, dtype=dtype)  # A (r, in)
        self.lora_B = Linear(r, base_layer.out_features, fused=fused).to(device=device, dtype=dtype)  # B (out, r)
        nn.init.zeros_(self.lora_B.weight)
        self.r, self.alpha, self.dropout = r, float(alpha), float(dropout)
        self.scaling = self.alpha / r
        self.merged = False
        self.enabled = True

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def delta_weight(self) -> torch.Tensor:
        """(alpha / r) B A, the (out, in) update the adapter adds to W."""
        return self.scaling * (self.lora_B.weight @ self.lora_A.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)
        if self.merged or not self.enabled:
            return y
        h = self.lora_A(inverted_dropout(x, self.dropout, self.training))  # (..., r)
        return y + self.scaling * self.lora_B(h)  # (..., out)

    @torch.no_grad()
    def merge(self) -> None:
        if isinstance(self.base_layer, BlockLinear):  # blocks cannot absorb the update: a dense copy does
            self.base_layer = dense_linear(self.base_layer)
        if not self.merged:
            self.base_layer.weight += self.delta_weight()
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        if self.merged:
            self.base_layer.weight -= self.delta_weight()
            self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha:g}, dropout={self.dropout:g}"


def dense_linear(layer: BlockLinear) -> Linear:
    """A Linear holding a BlockLinear's dequantized fp32 matrix (and bias), on the same device."""
    dense = Linear(layer.in_features, layer.out_features, bias=layer.bias is not None).to(layer.data.device)
    with torch.no_grad():
        dense.weight.copy_(layer.weight)
        if layer.bias is not None:
            dense.bias.copy_(layer.bias)
    return dense


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """{module name: LoRALinear} of every adapted layer."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def apply_lora(model: nn.Module, targets: tuple[str, ...] | list[str], r: int, alpha: float,
               dropout: float = 0.0) -> list[str]:
    """Wrap every Linear (or BlockLinear: QLoRA) whose last name is in `targets` (e.g. q_proj, v_proj) and
    freeze everything else.

    Returns the adapted module names. Raises a ValueError naming unknown targets or a model without them.
    """
    targets = tuple(dict.fromkeys(targets))
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if not targets or unknown:
        raise ValueError(f"LoRA targets {list(unknown or targets)} are not adaptable layers; choose from "
                         f"{list(LORA_TARGETS)}")
    if lora_layers(model):
        raise ValueError("the model already has LoRA adapters; merge or remove them before adding new ones")
    chosen = [(name, m) for name, m in model.named_modules()
              if isinstance(m, (Linear, BlockLinear)) and name.rsplit(".", 1)[-1] in targets]
    if not chosen:
        raise ValueError(f"the model has no linear layers named {list(targets)}")
    for p in model.parameters():
        p.requires_grad_(False)
    for name, layer in chosen:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, LoRALinear(layer, r, alpha, dropout))
    return [name for name, _ in chosen]


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its weight and put the plain Linear back (in place; a quantized base
    becomes a dense Linear, see LoRALinear.merge); returns the model."""
    for name, layer in lora_layers(model).items():
        layer.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, layer.base_layer)
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' weights only: {"...q_proj.lora_A.weight": A, "...q_proj.lora_B.weight": B, ...}."""
    return {k: v for k, v in model.state_dict().items() if ".lora_A." in k or ".lora_B." in k}


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the base model: inside the block every adapter is bypassed (the frozen reference of DPO/GRPO)."""
    layers = list(lora_layers(model).values())
    if any(layer.merged for layer in layers):
        raise ValueError("cannot disable merged adapters; unmerge them first")
    before = [layer.enabled for layer in layers]
    for layer in layers:
        layer.enabled = False
    try:
        yield model
    finally:
        for layer, was in zip(layers, before):
            layer.enabled = was
