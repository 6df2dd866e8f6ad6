"""Prompt + output strings -> the tensors a policy-gradient or SFT step needs, for any tokenizer.

For each pair, p = tokens(prompt) and o = tokens(output) are encoded separately and concatenated
(so no token straddles the boundary), then right-padded to the longest row S = max |p| + |o|:
    full (B, S)           = [p, o, pad...]
    input_ids (B, S - 1)  = full[:, :-1]        what the model reads
    labels (B, S - 1)     = full[:, 1:]         what position t must predict
    response_mask (B, S - 1) = 1 where labels[t] is an output token (not prompt, not padding)
`response_log_probs(model, input_ids, labels)` then gives log pi(o_j | p, o_<j) exactly where the mask is 1.

Tokenizers: scratchlm's `Tokenizer` (`encode`, special tokens written in the text are kept as such) or a
transformers tokenizer (`encode(text, add_special_tokens=False)`: no BOS/EOS is added silently — put
them in the strings when the model needs them). The pad id defaults to the tokenizer's pad token, else 0.
"""

from __future__ import annotations

from typing import Any

import torch


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` with no special tokens added (scratchlm or transformers tokenizer)."""
    if hasattr(tokenizer, "special_token_ids"):  # scratchlm.tokenizer.Tokenizer
        return list(tokenizer.encode(text))
    return list(tokenizer.encode(text, add_special_tokens=False))


def default_pad_id(tokenizer: Any) -> int:
    """The tokenizer's pad id (transformers `pad_token_id`), else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return int(pad) if pad is not None else 0


def tokenize_prompt_and_output(
    prompt_strs: list[str], output_strs: list[str], tokenizer: Any, pad_id: int | None = None,
) -> dict[str, torch.Tensor]:
    """{"input_ids", "labels", "response_mask"}, each (B, S - 1) (module docstring)."""
    if len(prompt_strs) != len(output_strs) or not prompt_strs:
        raise ValueError(f"need one output per prompt, got {len(prompt_strs)} prompts and {len(output_strs)} outputs")
    prompts = [encode_text(tokenizer, p) for p in prompt_strs]
    outputs = [encode_text(tokenizer, o) for o in output_strs]
    return prompt_output_tensors(prompts, outputs, default_pad_id(tokenizer) if pad_id is None else pad_id)


def prompt_output_tensors(prompts: list[list[int]], outputs: list[list[int]], pad_id: int = 0,
                          ) -> dict[str, torch.Tensor]:
    """The same tensors from token ids. A row needs at least 2 tokens in all (one to read, one to predict)."""
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        if len(p) + len(o) < 2:
            raise ValueError(f"pair {i} has {len(p) + len(o)} tokens; prompt + output need at least 2")
    s = max(len(p) + len(o) for p, o in zip(prompts, outputs))
    full = torch.full((len(prompts), s), pad_id, dtype=torch.long)
    is_output = torch.zeros(len(prompts), s, dtype=torch.bool)
    for b, (p, o) in enumerate(zip(prompts, outputs)):
        full[b, : len(p) + len(o)] = torch.tensor(p + o, dtype=torch.long)
        is_output[b, len(p): len(p) + len(o)] = True
    return {"input_ids": full[:, :-1], "labels": full[:, 1:], "response_mask": is_output[:, 1:]}
