"""Pooling, quantization and similarity of embeddings (pplx-embed §4.3).

- mean pooling over non-padding tokens;
- Matryoshka truncation to ``dim`` BEFORE quantization;
- INT8: ``round(127 * tanh(mean))``; training uses a straight-through estimator (forward = rounded,
  backward = gradient of ``127 * tanh``);
- binary: ``sign(mean)`` of the unquantized mean, packed 8 dimensions per byte (bit set = positive); a model
  saved with a binary centre ``c`` (``binary_centre.json``) stores ``sign(mean - c)`` instead, and its queries
  stay float: ``mean - c``, scored against the documents' bits (``asymmetric_binary_similarity``);
- cosine for int8 (the vectors are not normalized), Hamming for binary.
"""

from __future__ import annotations

import numpy as np
import torch

from embedlib.encoding.formats import QUANTIZATIONS, Quantization, centred

INT8_SCALE = 127.0


def mean_pool(token_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the token states over positions where ``attention_mask`` is 1: ``(B, L, d) -> (B, d)``."""
    mask = attention_mask.unsqueeze(-1).to(token_states.dtype)
    summed = (token_states * mask).sum(dim=1)
    return summed / mask.sum(dim=1).clamp(min=1.0)


def truncate(embeddings: torch.Tensor, dim: int | None) -> torch.Tensor:
    """Matryoshka truncation to the first ``dim`` dimensions (``None``: keep all)."""
    if dim is None:
        return embeddings
    full = embeddings.shape[-1]
    if not 0 < dim <= full:
        raise ValueError(f"dim must be in 1..{full}, got {dim}")
    return embeddings[..., :dim]


class _RoundStraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def int8_straight_through(pooled: torch.Tensor) -> torch.Tensor:
    """Training-time INT8: values equal ``round(127·tanh(x))``, gradients those of ``127·tanh(x)``."""
    return _RoundStraightThrough.apply(INT8_SCALE * torch.tanh(pooled))


class _SignStraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.where(x > 0, 1.0, -1.0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= 1).to(grad.dtype)


def binary_straight_through(pooled: torch.Tensor) -> torch.Tensor:
    """Training-time binary: values ``±1`` (``+1`` where ``x > 0``, the bit ``quantize_binary`` sets), gradients
    passed straight through where ``|x| <= 1``. Cosine of these is ``1 - 2·Hamming/d``: the served ranking."""
    return _SignStraightThrough.apply(pooled)


def quantize_int8(pooled: torch.Tensor) -> torch.Tensor:
    """Inference-time INT8 codes (dtype int8) of the pooled vectors."""
    return torch.round(INT8_SCALE * torch.tanh(pooled.float())).to(torch.int8)


def quantize_binary(pooled: torch.Tensor, centre: np.ndarray | None = None) -> np.ndarray:
    """``sign(x - centre)`` packed 8 per byte, big-endian bit order (``np.packbits``): ``(n, d) -> (n, ceil(d/8))``."""
    bits = centred(pooled.float().cpu().numpy(), centre) > 0
    return np.packbits(bits, axis=-1)


def quantize(pooled: torch.Tensor, quantization: Quantization, centre: np.ndarray | None = None) -> np.ndarray:
    """Turn pooled float vectors into the stored representation for ``quantization`` (``centre``: binary's)."""
    if quantization == "float":
        return pooled.float().cpu().numpy()
    if quantization == "int8":
        return quantize_int8(pooled).cpu().numpy()
    if quantization == "binary":
        return quantize_binary(pooled, centre)
    raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
