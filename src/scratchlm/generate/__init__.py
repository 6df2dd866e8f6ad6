"""Text generation: samplers (pure functions on logits) and the KV-cache engine (batched, streaming)."""

from scratchlm.generate.engine import generate, iter_decode
from scratchlm.generate.sampling import SamplingParams
from scratchlm.generate.streaming import stream_generate

__all__ = ["SamplingParams", "generate", "iter_decode", "stream_generate"]
