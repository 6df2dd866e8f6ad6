"""Quantized weights: ggml block formats (as stored in GGUF files), their dequantization and quantization,
and the containers that carry them from a loader to the fast decode kernels."""
