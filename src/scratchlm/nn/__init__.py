"""From-scratch neural-network building blocks, one concept per file."""

from scratchlm.nn.activations import gelu, gelu_tanh, relu, sigmoid, silu
from scratchlm.nn.attention import Attention, scaled_dot_product_attention, sdpa_attention
from scratchlm.nn.embedding import Embedding
from scratchlm.nn.ffn import GLU, MLP, SwiGLU, swiglu_hidden_dim
from scratchlm.nn.kv_cache import KVCache
from scratchlm.nn.linear import Linear
from scratchlm.nn.moe import MoE
from scratchlm.nn.norm import BatchNorm1d, LayerNorm, RMSNorm
from scratchlm.nn.positional import LearnedPositions, SinusoidalPositions
from scratchlm.nn.rope import RotaryEmbedding
from scratchlm.nn.softcap import softcap
from scratchlm.nn.softmax import log_softmax, softmax

__all__ = [
    "Attention", "BatchNorm1d", "Embedding", "GLU", "KVCache", "LayerNorm", "LearnedPositions", "Linear", "MLP",
    "MoE", "RMSNorm", "RotaryEmbedding", "SinusoidalPositions", "SwiGLU", "gelu", "gelu_tanh", "log_softmax",
    "relu", "scaled_dot_product_attention", "sdpa_attention", "sigmoid", "silu", "softcap", "softmax",
    "swiglu_hidden_dim",
]
