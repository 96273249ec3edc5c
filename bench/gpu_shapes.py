"""Model shapes and peak throughput the GPU benches measure against (bench-only constants)."""

from __future__ import annotations

# The published Qwen3-0.6B(-Base) shape, for throughput benchmarks of a random-init model of that size.
QWEN3_0_6B_SHAPE = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000,
    tie_word_embeddings=True,
)
H200_BF16_DENSE_TFLOPS = 989.5  # NVIDIA H200 SXM, bf16 tensor cores, dense (no sparsity)
