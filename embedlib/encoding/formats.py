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


def normalized(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, as contiguous float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise cosine between the rows of ``a`` and ``b`` (float or int8 inputs)."""
    return normalized(a) @ normalized(b).T


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int32)


def hamming_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise Hamming distance between packed binary codes ``(n, B)`` and ``(m, B)``."""
    xor = np.bitwise_xor(a[:, None, :], b[None, :, :])
    return _POPCOUNT[xor].sum(axis=-1)


def centred(vectors: np.ndarray, centre: np.ndarray | None) -> np.ndarray:
    """``vectors - centre`` (the centre's first ``d`` entries: Matryoshka) as float32; ``vectors`` without one."""
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors if centre is None else vectors - np.asarray(centre, dtype=np.float32)[: vectors.shape[-1]]


def binary_queries(vectors: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Float queries of a centred binary index: ``x - centre``, unit length."""
    return normalized(centred(vectors, centre))


def signs(packed: np.ndarray, dim: int) -> np.ndarray:
    """Packed binary codes ``(n, B)`` as float32 ``±1`` ``(n, dim)`` (``+1`` where the bit is set)."""
    return np.unpackbits(packed, axis=-1, count=dim).astype(np.float32) * 2.0 - 1.0


def asymmetric_binary_similarity(queries: np.ndarray, packed: np.ndarray) -> np.ndarray:
    """Cosine between float queries ``(n, d)`` and the ``±1`` vectors of packed codes ``(m, ceil(d/8))``."""
    dim = queries.shape[1]
    return normalized(queries) @ signs(packed, dim).T / np.float32(np.sqrt(dim))


def similarity(a: np.ndarray, b: np.ndarray, quantization: Quantization) -> np.ndarray:
    """Higher-is-better pairwise scores: cosine, or for binary codes ``-hamming`` (packed queries) or the
    asymmetric cosine (float queries of a centred binary index)."""
    if quantization == "binary":
        if a.dtype.kind == "f":
            return asymmetric_binary_similarity(a, b)
        return -hamming_distance(a, b).astype(np.float32)
    return cosine_similarity(a, b)
