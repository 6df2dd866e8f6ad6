"""Text generation: samplers (pure functions on logits) and the KV-cache engine (batched, streaming)."""

from scratchlm.generate.engine import generate, iter_decode
from scratchlm.generate.sampling import SamplingParams

__all__ = ["SamplingParams", "generate", "iter_decode"]
