"""DiffRetriever search: multi-vector dense (MaxSim), sparse lexical, and their hybrid.

Hybrid: dense and sparse scores are min-max normalised per query (over the documents being ranked) and
interpolated, ``dense_weight * dense + (1 - dense_weight) * sparse`` (0.5 by default). With indexes, the
ranked documents are the union of each side's candidates, scored exactly on both sides.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import scipy.sparse as sp

from embedlib import storage
from embedlib.search.multivector import DEFAULT_FACTORY, MultiVectorIndex, maxsim_scores, top_k
from embedlib.search.results import SearchResult
from embedlib.search.sparse import SparseIndex, sparse_scores

if TYPE_CHECKING:  # annotations only: search stays torch-free (configs import its modes)
    from embedlib.encoding.representative_tokens import RepresentativeTokens

Mode = Literal["dense", "sparse", "hybrid"]
MODES = ("dense", "sparse", "hybrid")
DEFAULT_DENSE_WEIGHT = 0.5
MANIFEST_FILE = "diffretriever.json"


def check_weight(dense_weight: float) -> float:
    if not 0.0 <= dense_weight <= 1.0:
        raise ValueError(f"dense_weight must be in [0, 1], got {dense_weight}")
    return float(dense_weight)


def minmax_rows(scores: np.ndarray) -> np.ndarray:
    """Each row scaled to [0, 1]; a constant row becomes all zeros."""
    low = scores.min(axis=1, keepdims=True)
    span = scores.max(axis=1, keepdims=True) - low
    return np.where(span > 0, (scores - low) / np.where(span > 0, span, 1.0), 0.0).astype(np.float32)


def hybrid_scores(
    dense: np.ndarray, sparse: np.ndarray, dense_weight: float = DEFAULT_DENSE_WEIGHT
) -> np.ndarray:
    """Per-query min-max normalised dense and sparse scores, interpolated."""
    if dense.shape != sparse.shape:
        raise ValueError(f"dense scores {dense.shape} and sparse scores {sparse.shape} differ in shape")
    weight = check_weight(dense_weight)
    return weight * minmax_rows(dense) + (1.0 - weight) * minmax_rows(sparse)


def exhaustive_scores(
    queries: RepresentativeTokens,
    docs: RepresentativeTokens,
    mode: Mode,
    dense_weight: float = DEFAULT_DENSE_WEIGHT,
) -> np.ndarray:
    """Scores of every query against every document ``(n_queries, n_docs)`` (evaluation without an index)."""
    if mode == "dense":
        return maxsim_scores(queries.dense, docs.dense)
    if mode == "sparse":
        return sparse_scores(queries.sparse, docs.sparse)
    if mode == "hybrid":
        return hybrid_scores(
            maxsim_scores(queries.dense, docs.dense), sparse_scores(queries.sparse, docs.sparse), dense_weight
        )
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


@dataclass
class Candidates:
    """One query's candidate documents with their raw (not normalised) dense and sparse scores."""

    positions: np.ndarray  # int64
    dense: np.ndarray  # float32 MaxSim
    sparse: np.ndarray  # float32 sparse dot product


def fuse_candidates(
    found: Sequence[Candidates], k: int, dense_weight: float = DEFAULT_DENSE_WEIGHT
) -> SearchResult:
    """Hybrid top-``k`` documents (positions) per query: min-max normalised over each query's candidates."""
    weight = check_weight(dense_weight)
    positions = np.full((len(found), k), -1, dtype=np.int64)
    scores = np.full((len(found), k), -np.inf, dtype=np.float32)
    for row, candidates in enumerate(found):
        if not len(candidates.positions):
            continue
        fused = hybrid_scores(candidates.dense[None, :], candidates.sparse[None, :], weight)
        best = top_k(fused, k)
        positions[row, : best.positions.shape[1]] = candidates.positions[best.positions[0]]
        scores[row, : best.scores.shape[1]] = best.scores[0]
    return SearchResult(positions=positions, scores=scores)


class DiffRetrieverIndex:
    """A multi-vector dense index and a sparse inverted index over the same documents."""

    def __init__(self, dense: MultiVectorIndex, sparse: SparseIndex):
        if len(dense) != len(sparse):
            raise ValueError(f"dense index has {len(dense)} docs, sparse index {len(sparse)}")
        self.dense = dense
        self.sparse = sparse

    @classmethod
    def build(
        cls, docs: RepresentativeTokens, factory: str = DEFAULT_FACTORY, scale: float = 100.0
    ) -> DiffRetrieverIndex:
        return cls(MultiVectorIndex(docs.dense, factory=factory), SparseIndex(docs.sparse, scale=scale))

    def __len__(self) -> int:
        return len(self.dense)

    def search(
        self,
        queries: RepresentativeTokens,
        k: int,
        mode: Mode = "hybrid",
        dense_weight: float = DEFAULT_DENSE_WEIGHT,
        candidates: int = 100,
    ) -> SearchResult:
        """Top-``k`` documents (positions) per query, best first."""
        if mode == "dense":
            return self.dense.search(queries.dense, k)
        if mode == "sparse":
            return self.sparse.search(queries.sparse, k)
        if mode != "hybrid":
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        return self.hybrid_search(queries.dense, queries.sparse, k, check_weight(dense_weight), candidates)

    def hybrid_search(
        self,
        dense_queries: Sequence[np.ndarray],
        sparse_queries: sp.spmatrix,
        k: int,
        dense_weight: float,
        candidates: int,
    ) -> SearchResult:
        """Union of both sides' top ``candidates``, exact scores on both sides, normalised and fused."""
        found = self.hybrid_candidates(dense_queries, sparse_queries, candidates)
        return fuse_candidates(found, k, dense_weight)

    def hybrid_candidates(
        self, dense_queries: Sequence[np.ndarray], sparse_queries: sp.spmatrix, candidates: int
    ) -> list[Candidates]:
        """Per query, the union of both sides' top ``candidates`` with exact raw dense and sparse scores."""
        dense_top = self.dense.search(dense_queries, candidates).positions
        sparse_top = self.sparse.search(sparse_queries, candidates).positions
        found = []
        for row, query in enumerate(dense_queries):
            union = np.union1d(dense_top[row][dense_top[row] >= 0], sparse_top[row][sparse_top[row] >= 0])
            found.append(
                Candidates(union, self.dense.rerank(query, union), self.sparse.score_docs(sparse_queries[row], union))
            )
        return found

    def bytes_per_doc(self) -> dict[str, float]:
        dense, sparse = self.dense.bytes_per_doc(), self.sparse.bytes_per_doc()
        return {"dense": dense, "sparse": sparse, "total": dense + sparse}

    def save(self, url: str | os.PathLike) -> None:
        """Write ``dense/``, ``sparse/`` and a manifest (written last: its presence marks a complete index)."""
        self.dense.save(storage.join(url, "dense"))
        self.sparse.save(storage.join(url, "sparse"))
        manifest = {"docs": len(self), "bytes_per_doc": self.bytes_per_doc(), "parts": ["dense", "sparse"]}
        storage.write_bytes_atomic(storage.join(url, MANIFEST_FILE), json.dumps(manifest, indent=2).encode())

    @classmethod
    def load(cls, url: str | os.PathLike) -> DiffRetrieverIndex:
        if not storage.exists(storage.join(url, MANIFEST_FILE)):
            raise FileNotFoundError(f"{storage.join(url, MANIFEST_FILE)}: no DiffRetriever index manifest")
        return cls(
            MultiVectorIndex.load(storage.join(url, "dense")), SparseIndex.load(storage.join(url, "sparse"))
        )
