"""What is embedded and how it is stored: a document's embedded text, the stored embedding formats and their
similarities, in numpy alone (no torch: light enough for every Ray worker that only reads, writes or searches
vectors, and for drivers)."""

from __future__ import annotations

from typing import Literal

import numpy as np

Quantization = Literal["float", "int8", "binary"]
QUANTIZATIONS: tuple[str, ...] = ("float", "int8", "binary")


def embedded_text(title: str | None, text: str) -> str:
    """The text a document is embedded as (BEIR's and sentence-transformers' ``title + " " + text``)."""
    return f"{title} {text}".strip() if title else text


def output_width(dim: int, quantization: Quantization) -> int:
    """Columns of the stored array for ``dim`` dimensions."""
    return (dim + 7) // 8 if quantization == "binary" else dim


def output_dtype(quantization: Quantization) -> np.dtype:
    return {"float": np.dtype(np.float32), "int8": np.dtype(np.int8), "binary": np.dtype(np.uint8)}[quantization]


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise cosine between the rows of ``a`` and ``b`` (float or int8 inputs)."""
    a = a.astype(np.float32)
    b = b.astype(np.float32)
    a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return a @ b.T


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int32)


def hamming_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise Hamming distance between packed binary codes ``(n, B)`` and ``(m, B)``."""
    xor = np.bitwise_xor(a[:, None, :], b[None, :, :])
    return _POPCOUNT[xor].sum(axis=-1)


def similarity(a: np.ndarray, b: np.ndarray, quantization: Quantization) -> np.ndarray:
    """Higher-is-better pairwise scores: cosine, or ``-hamming`` for binary codes."""
    if quantization == "binary":
        return -hamming_distance(a, b).astype(np.float32)
    return cosine_similarity(a, b)
