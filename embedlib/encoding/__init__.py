"""Encoding stage: pooling, quantization, batching and the ``Encoder``."""
