"""Model shapes and peak throughput the GPU benches measure against (bench-only constants)."""

from __future__ import annotations

import argparse

from embedlib.models.tiny import TINY_QWEN3_SHAPE

# The published Qwen3-0.6B(-Base) shape (the tiny test shape's fields, at full size), for throughput benchmarks
# of a random-init model of that size.
QWEN3_0_6B_SHAPE = dict(
    TINY_QWEN3_SHAPE, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000,
)
H200_BF16_DENSE_TFLOPS = 989.5  # NVIDIA H200 SXM, bf16 tensor cores, dense (no sparsity)


def gpu_bench_parser(description: str, tiny_help: str) -> argparse.ArgumentParser:
    """The flags every GPU bench takes: ``--tiny`` (a CPU check that the script runs) and ``--peak-tflops``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help=tiny_help)
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    return parser
