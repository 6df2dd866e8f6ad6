"""From-scratch neural-network building blocks, one concept per file."""

from scratchlm.nn.activations import gelu, gelu_tanh, relu, sigmoid, silu
from scratchlm.nn.attention import Attention, scaled_dot_product_attention, sdpa_attention
from scratchlm.nn.embedding import Embedding
from scratchlm.nn.ffn import MLP, SwiGLU, swiglu_hidden_dim
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.linear import Linear
from scratchlm.nn.norm import BatchNorm1d, LayerNorm, RMSNorm
from scratchlm.nn.positional import LearnedPositions, SinusoidalPositions
from scratchlm.nn.rope import RotaryEmbedding
from scratchlm.nn.softmax import log_softmax, softmax

__all__ = [
    "Attention", "BatchNorm1d", "Embedding", "KVCache", "LayerNorm", "LearnedPositions", "Linear", "MLP",
    "RMSNorm", "RotaryEmbedding", "SinusoidalPositions", "SwiGLU", "gelu", "gelu_tanh", "log_softmax",
    "relu", "scaled_dot_product_attention", "sdpa_attention", "sigmoid", "silu", "softmax",
    "swiglu_hidden_dim",
]
