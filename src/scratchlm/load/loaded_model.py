"""`LoadedModel`: a model with everything it needs to run (tokenizer, chat template, stop ids, defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.model import TransformerLM


@dataclass
class LoadedModel:
    """A model with what it needs to run: tokenizer, chat template, stop ids, sampling defaults."""

    model: TransformerLM
    tokenizer: Any
    chat_template: str | None
    stop_token_ids: list[int]
    bos_token_id: int | None
    sampling: dict[str, float]
    kind: str
    path: Path
    family: str
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)
    weight_types: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: what was loaded (kind, family, params, dtype, context, template, stop tokens)."""
        params = sum(p.numel() for p in self.model.parameters())
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        stored = ", ".join(f"{n} {t}" for t, n in sorted(self.weight_types.items(), key=lambda kv: -kv[1]))
        template = "the model's own" if self.chat_template else "scratchlm ChatML (the model has none)"
        stops = [self.tokenizer.decode([i]) for i in self.stop_token_ids]
        return (f"{self.kind} {self.path.name}: {self.family}, {params / 1e6:.1f}M params, {dtype}"
                f"{f' (file tensors: {stored})' if stored else ''}, context {self.model.config.max_seq_len}, "
                f"chat template: {template}, stop tokens {stops}")
