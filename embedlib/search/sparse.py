"""Sparse lexical retrieval over representative-token vocab weights: an inverted index with integer weights.

Document weights are quantized to integers as PromptReps does (``round(weight * scale)``, ``scale`` = 100)
and kept as a compressed sparse column matrix (term -> postings); a query (float weights) is scored by a
sparse dot product with the postings of its terms only.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import scipy.sparse as sp

from embedlib import storage
from embedlib.search.multivector import top_k
from embedlib.search.results import SearchResult

DEFAULT_SCALE = 100.0
MATRIX_FILE = "postings.npz"
META_FILE = "sparse.json"


def quantize_weights(matrix: sp.spmatrix, scale: float = DEFAULT_SCALE) -> sp.csr_matrix:
    """``round(w * scale)`` as uint16 (weights are ``log(1+ReLU)``, so non-negative); zeros are dropped."""
    matrix = sp.csr_matrix(matrix, dtype=np.float32)
    if matrix.nnz and matrix.data.min() < 0:
        raise ValueError("sparse weights must be non-negative")
    codes = np.rint(matrix.data * scale)
    if codes.size and codes.max() > np.iinfo(np.uint16).max:
        raise ValueError(f"weight {matrix.data.max():.3f} * scale {scale} does not fit uint16")
    quantized = sp.csr_matrix((codes.astype(np.uint16), matrix.indices, matrix.indptr), shape=matrix.shape)
    quantized.eliminate_zeros()
    return quantized


def sparse_scores(queries: sp.spmatrix, docs: sp.spmatrix) -> np.ndarray:
    """Dot products of sparse query and document vectors ``(n_queries, n_docs)`` (dense result)."""
    if queries.shape[1] != docs.shape[1]:
        raise ValueError(f"vocabulary sizes differ: queries {queries.shape[1]}, docs {docs.shape[1]}")
    return np.asarray(
        (sp.csr_matrix(queries, dtype=np.float32) @ sp.csr_matrix(docs, dtype=np.float32).T).toarray(),
        dtype=np.float32,
    )


class SparseIndex:
    """An inverted index (CSC: term -> documents) of integer-quantized term weights."""

    def __init__(self, docs: sp.spmatrix, scale: float = DEFAULT_SCALE):
        self.scale = float(scale)
        self.postings = quantize_weights(docs, scale).tocsc()

    @classmethod
    def from_postings(cls, postings: sp.spmatrix, scale: float) -> SparseIndex:
        """An index from already quantized postings (what ``postings_bytes`` wrote)."""
        index = cls.__new__(cls)
        index.scale, index.postings = float(scale), sp.csc_matrix(postings)
        return index

    def postings_bytes(self) -> bytes:
        """The quantized postings as one ``.npz`` file."""
        buffer = io.BytesIO()
        sp.save_npz(buffer, self.postings)
        return buffer.getvalue()

    def __len__(self) -> int:
        return self.postings.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.postings.shape[1]

    def scores(self, queries: sp.spmatrix) -> np.ndarray:
        """Scores of every document ``(n_queries, n_docs)`` in the original weight units."""
        if queries.shape[1] != self.vocab_size:
            raise ValueError(
                f"query vocabulary size {queries.shape[1]} != index vocabulary size {self.vocab_size}"
            )
        product = sp.csr_matrix(queries, dtype=np.float32) @ self.postings.T.astype(np.float32)
        return np.asarray(product.toarray(), dtype=np.float32) / self.scale

    def score_docs(self, query: sp.spmatrix, docs: np.ndarray) -> np.ndarray:
        """Scores of one query against the documents at positions ``docs``."""
        return self.scores(query)[0, docs]

    def search(self, queries: sp.spmatrix, k: int) -> SearchResult:
        """Top-``k`` documents (positions) per query, best first."""
        return top_k(self.scores(queries), k)

    def bytes_per_doc(self) -> float:
        """Stored bytes per document: postings (uint16 weight + int32 doc id each) and column pointers."""
        total = self.postings.data.nbytes + self.postings.indices.nbytes + self.postings.indptr.nbytes
        return total / len(self)

    def save(self, url: str | os.PathLike) -> None:
        storage.write_bytes_atomic(storage.join(url, MATRIX_FILE), self.postings_bytes())
        meta = {
            "scale": self.scale,
            "docs": len(self),
            "vocab_size": self.vocab_size,
            "postings": int(self.postings.nnz),
        }
        storage.write_bytes_atomic(storage.join(url, META_FILE), json.dumps(meta).encode())

    @classmethod
    def load(cls, url: str | os.PathLike) -> SparseIndex:
        meta = json.loads(storage.read_bytes(storage.join(url, META_FILE)))
        postings = sp.load_npz(io.BytesIO(storage.read_bytes(storage.join(url, MATRIX_FILE))))
        index = cls.from_postings(postings, meta["scale"])
        if index.postings.nnz != meta["postings"] or len(index) != meta["docs"]:
            raise ValueError(
                f"{storage.redact_url(url)}: postings file holds {index.postings.nnz} postings / {len(index)} docs, "
                f"{META_FILE} says {meta['postings']} / {meta['docs']}"
            )
        return index
