"""`LoadedModel`: a model with everything it needs to run (tokenizer, chat template, stop ids, defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.generate.decode_step import resolve_decode
from scratchlm.model import TransformerLM
from scratchlm.model_stats import count_parameters, repacked_memory, weight_memory


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
        """One line: what was loaded (kind, family, params, weights and their memory, context, template, stop
        tokens)."""
        params = count_parameters(self.model)
        memory = weight_memory(self.model)
        dtype = str(self.model.dtype).removeprefix("torch.")
        if memory["blocks"]:
            mode = resolve_decode(self.model, "auto")
            copy = repacked_memory(self.model) if mode == "fast-gguf" else 0
            copied = f", {copy / 1e6:.1f} MB of them repacked in their place" if copy else ""
            dtype = (f"on the file's own blocks ({memory['blocks'] / 1e6:.1f} MB mapped{copied} + "
                     f"{memory['dense'] / 1e6:.1f} MB {dtype}; decode {mode})")
        else:
            dtype = f"{dtype} ({memory['dense'] / 1e6:.1f} MB)"
        stored = ", ".join(f"{n} {t}" for t, n in sorted(self.weight_types.items(), key=lambda kv: -kv[1]))
        template = "the model's own" if self.chat_template else "scratchlm ChatML (the model has none)"
        stops = [self.tokenizer.decode([i]) for i in self.stop_token_ids]
        return (f"{self.kind} {self.path.name}: {self.family}, {params / 1e6:.1f}M params, {dtype}"
                f"{f' (file tensors: {stored})' if stored else ''}, context {self.model.config.max_seq_len}, "
                f"chat template: {template}, stop tokens {stops}")
