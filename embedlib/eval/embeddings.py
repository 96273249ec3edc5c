"""Float embeddings for evaluation, encoded once per text list and optionally cached at any URL.

int8 and binary codes are derived from the float vectors with the encoder's own ``quantize`` (exactly what
``Encoder.encode(quantization=...)`` returns), so one forward pass serves every quantization. The cache
is chunked and keyed by the weights hash, ``max_length`` and the chunk's texts, so an interrupted run
resumes and a larger distractor set reuses the chunks of a smaller one.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from embedlib import storage
from embedlib.encoding.encoder import Encoder
from embedlib.encoding.formats import Quantization
from embedlib.encoding.quantize import quantize, truncate

log = logging.getLogger(__name__)

CACHE_CHUNK = 8192


def chunk_key(encoder: Encoder, texts: Sequence[str]) -> str:
    digest = hashlib.sha256(f"{encoder.weights_hash}:{encoder.max_length}:{len(texts)}".encode())
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()[:32]


def encode_float(
    encoder: Encoder, texts: Sequence[str], cache: str | None = None, desc: str = "encode",
    show_progress: bool = True, chunk: int = CACHE_CHUNK,
) -> np.ndarray:
    """Float32 ``(n, d)`` embeddings of ``texts``, read from / written to ``cache`` chunk by chunk."""
    texts = list(texts)
    parts = []
    with tqdm(total=len(texts), desc=desc, unit="text", disable=not show_progress) as bar:
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            parts.append(_encode_chunk(encoder, part, cache))
            bar.update(len(part))
    if not parts:
        return np.zeros((0, encoder.dim), dtype=np.float32)
    return np.concatenate(parts)


def _encode_chunk(encoder: Encoder, texts: list[str], cache: str | None) -> np.ndarray:
    url = storage.join(cache, f"{chunk_key(encoder, texts)}.npy") if cache else None
    if url and storage.exists(url):
        return np.load(io.BytesIO(storage.read_bytes(url)))
    vectors = encoder.encode(texts, quantization="float")
    if url:
        buffer = io.BytesIO()
        np.save(buffer, vectors)
        storage.write_bytes_atomic(url, buffer.getvalue())
    return vectors


def quantized(
    vectors: np.ndarray, quantization: Quantization, dim: int | None = None, centre: np.ndarray | None = None
) -> np.ndarray:
    """The stored representation of float ``vectors`` for ``quantization`` (after Matryoshka ``dim``; binary
    codes centred on ``centre``, the encoder's ``binary_centre``)."""
    return quantize(truncate(torch.from_numpy(vectors), dim), quantization, centre)


class PrefixCache:
    """Encodings of the text lists seen so far: a list that is a prefix of a known one is not encoded again
    (corpus-growth runs encode the largest corpus first, and smaller scales reuse its prefix)."""

    def __init__(self, most: int | None = None):
        self.most = most  # how many lists are kept (the newest), all by default
        self._known: list[tuple[list[str], object]] = []

    def get(self, texts: Sequence[str], encode, take):
        """``take(encoded, n)`` of a known list that ``texts`` starts, else ``encode(texts)`` (then kept)."""
        texts = list(texts)
        for known, encoded in self._known:
            if len(texts) <= len(known) and known[: len(texts)] == texts:
                return take(encoded, len(texts))
        encoded = encode(texts)
        self._known.append((texts, encoded))
        if self.most:
            del self._known[: -self.most]
        return encoded
