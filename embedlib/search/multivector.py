"""Multi-vector dense retrieval: ColBERT-style MaxSim and a FAISS index over every representative vector.

MaxSim of a query ``(Kq, d)`` and a document ``(Kp, d)`` (unit rows): for each query vector the best dot
product with any document vector, clamped at 0, summed over the query vectors.

The index keeps all document vectors in one FAISS index with a vector -> document map; a search asks FAISS
for the nearest vectors of each query vector, takes their documents as candidates, and reranks those with
exact MaxSim over the stored vectors. Vectors are stored as float16 (``STORED_DTYPE``), in the reranking copy
and in FAISS (``SQfp16``, the default factory): half of float32's bytes, unit vectors lose ~1e-3 per score.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence

import faiss
import numpy as np

from embedlib import storage
from embedlib.search.results import SearchResult

STORED_DTYPE = np.float16
DEFAULT_FACTORY = "SQfp16"
INDEX_FILE = "vectors.faiss"
ARRAYS_FILE = "multivector.npz"
META_FILE = "multivector.json"


def stack_vectors(docs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """All vectors of ``docs`` as one float32 ``(N, d)`` array and the row offsets ``(n_docs + 1,)``."""
    if not docs:
        raise ValueError("no documents")
    lengths = np.array([len(doc) for doc in docs], dtype=np.int64)
    if (lengths < 1).any():
        raise ValueError(f"document {int(np.argmin(lengths))} has no vectors")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.ascontiguousarray(np.concatenate(docs).astype(np.float32)), offsets


def maxsim_from_similarities(similarities: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """MaxSim per document from query-vector x document-vector dot products ``(Kq, N)``: ``(n_docs,)``."""
    clamped = np.maximum(similarities, 0.0)
    return np.maximum.reduceat(clamped, offsets[:-1], axis=1).sum(axis=0)


def maxsim_scores(queries: Sequence[np.ndarray], docs: Sequence[np.ndarray]) -> np.ndarray:
    """Exhaustive MaxSim scores ``(n_queries, n_docs)``."""
    vectors, offsets = stack_vectors(docs)
    return np.stack(
        [maxsim_from_similarities(query.astype(np.float32) @ vectors.T, offsets) for query in queries]
    )


def top_k(scores: np.ndarray, k: int) -> SearchResult:
    """The ``k`` best columns (positions) per row, best first (``k`` capped at the width)."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    part_scores = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-part_scores, axis=1, kind="stable")
    return SearchResult(
        positions=np.take_along_axis(part, order, axis=1).astype(np.int64),
        scores=np.take_along_axis(part_scores, order, axis=1),
    )


class MultiVectorIndex:
    """FAISS over all representative vectors of the documents, with exact MaxSim reranking."""

    def __init__(self, docs: Sequence[np.ndarray], factory: str = DEFAULT_FACTORY):
        vectors, self.offsets = stack_vectors(docs)
        self.vectors = vectors.astype(STORED_DTYPE)
        self.vector_doc = np.repeat(np.arange(len(docs), dtype=np.int64), np.diff(self.offsets))
        self.factory = factory
        self.faiss = faiss.index_factory(self.dim, factory, faiss.METRIC_INNER_PRODUCT)
        if not self.faiss.is_trained:
            self.faiss.train(vectors)
        self.faiss.add(vectors)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def doc_vectors(self, doc: int) -> np.ndarray:
        return self.vectors[self.offsets[doc] : self.offsets[doc + 1]]

    def candidates(self, query: np.ndarray, vectors_per_query_vector: int) -> np.ndarray:
        """Documents owning any of the nearest vectors of any query vector (sorted positions)."""
        _, ids = self.faiss.search(np.ascontiguousarray(query, dtype=np.float32), vectors_per_query_vector)
        return np.unique(self.vector_doc[ids[ids >= 0]])

    def rerank(self, query: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """Exact MaxSim of ``query`` against the documents at positions ``docs``."""
        starts, ends = self.offsets[docs], self.offsets[docs + 1]
        rows = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)])
        local_offsets = np.concatenate([[0], np.cumsum(ends - starts)])
        stored = self.vectors[rows].astype(np.float32)
        return maxsim_from_similarities(query.astype(np.float32) @ stored.T, local_offsets)

    def search(
        self, queries: Sequence[np.ndarray], k: int, vectors_per_query_vector: int | None = None
    ) -> SearchResult:
        """Top-``k`` documents by MaxSim per query, best first (positions; ``-1`` / ``-inf`` fill short rows).

        Candidates: the documents owning each query vector's ``vectors_per_query_vector`` nearest vectors;
        by default ``max(256, k × the most vectors a document has)``, so at least ``k`` documents come back
        whatever K_p is.
        """
        if vectors_per_query_vector is None:
            most = int(np.diff(self.offsets).max()) if len(self) else 1
            vectors_per_query_vector = max(256, k * most)
        positions = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        for row, query in enumerate(queries):
            docs = self.candidates(query, min(vectors_per_query_vector, self.faiss.ntotal))
            exact = self.rerank(query, docs)
            best = top_k(exact[None, :], k)
            positions[row, : best.positions.shape[1]] = docs[best.positions[0]]
            scores[row, : best.scores.shape[1]] = best.scores[0]
        return SearchResult(positions=positions, scores=scores)

    def bytes_per_doc(self) -> float:
        """Stored bytes per document: the vectors (float16, for exact MaxSim), their entries in the vector -> doc
        map, and the FAISS index over them (which holds its own copy of the vectors)."""
        faiss_bytes = faiss.serialize_index(self.faiss).nbytes
        return (self.vectors.nbytes + self.offsets.nbytes + faiss_bytes) / len(self)

    def save(self, url: str | os.PathLike) -> None:
        """Write the index to a folder (local path or fsspec URL)."""
        buffer = io.BytesIO()
        np.savez(buffer, vectors=self.vectors, offsets=self.offsets)
        storage.write_bytes_atomic(storage.join(url, ARRAYS_FILE), buffer.getvalue())
        storage.write_bytes_atomic(storage.join(url, INDEX_FILE), faiss.serialize_index(self.faiss).tobytes())
        meta = {
            "factory": self.factory,
            "docs": len(self),
            "vectors": int(self.faiss.ntotal),
            "dim": self.dim,
        }
        storage.write_bytes_atomic(storage.join(url, META_FILE), json.dumps(meta).encode())

    @classmethod
    def from_arrays(cls, vectors: np.ndarray, offsets: np.ndarray, index, factory: str) -> MultiVectorIndex:
        """An index from its stored parts: stacked vectors, per-document offsets and the FAISS index."""
        built = cls.__new__(cls)
        built.vectors, built.offsets, built.factory, built.faiss = vectors, offsets, factory, index
        built.vector_doc = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
        if index.ntotal != len(vectors):
            raise ValueError(f"FAISS index holds {index.ntotal} vectors, {len(vectors)} were stored")
        return built

    @classmethod
    def load(cls, url: str | os.PathLike) -> MultiVectorIndex:
        meta = json.loads(storage.read_bytes(storage.join(url, META_FILE)))
        arrays = np.load(io.BytesIO(storage.read_bytes(storage.join(url, ARRAYS_FILE))))
        raw = np.frombuffer(storage.read_bytes(storage.join(url, INDEX_FILE)), dtype=np.uint8)
        index = cls.from_arrays(arrays["vectors"], arrays["offsets"], faiss.deserialize_index(raw), meta["factory"])
        if index.faiss.ntotal != meta["vectors"] or len(index) != meta["docs"]:
            raise ValueError(
                f"{storage.redact_url(url)}: index holds {index.faiss.ntotal} vectors / {len(index)} docs, "
                f"{META_FILE} says {meta['vectors']} / {meta['docs']}"
            )
        return index
