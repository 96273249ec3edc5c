"""``SearchResult``: what every search in embedlib returns, so that scores, ids and positions cannot be swapped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """Top-``k`` hits per query, best first; short rows end in score ``-inf`` (id ``None``, position ``-1``).

    ``scores``: float32 ``(n, k)``. ``ids``: the documents' ids, for searches over named documents.
    ``positions``: int64 ``(n, k)`` rows of the searched collection, for indexes over a list of documents.
    """

    scores: np.ndarray
    ids: list[list[str | None]] | None = None
    positions: np.ndarray | None = None

    @classmethod
    def empty(cls, n: int, k: int) -> SearchResult:
        """``n`` queries without hits: every place a fill."""
        return cls(
            scores=np.full((n, k), -np.inf, np.float32),
            ids=[[None] * k for _ in range(n)],
            positions=np.full((n, k), -1, np.int64),
        )

    def __len__(self) -> int:
        return len(self.scores)

    def named(self, ids: Sequence[str]) -> SearchResult:
        """The same hits with ``ids[position]`` as their ids."""
        if self.positions is None:
            raise ValueError("a result without positions cannot be named")
        named = [[ids[p] if p >= 0 else None for p in row] for row in self.positions.tolist()]
        return replace(self, ids=named)

    def hits(self) -> list[list[str]]:
        """Per query, the ids found (fills left out)."""
        if self.ids is None:
            raise ValueError("a result without ids has no hits; name it first (named)")
        return [[doc for doc in row if doc is not None] for row in self.ids]


def top_k_candidates(scores: np.ndarray, positions: np.ndarray, k: int) -> SearchResult:
    """Per row, the ``k`` highest scores (ties: lower position first), padded with ``-inf`` / ``-1``."""
    n = scores.shape[0]
    out_scores = np.full((n, k), -np.inf, dtype=np.float32)
    out_positions = np.full((n, k), -1, dtype=np.int64)
    for row in range(n):
        valid = positions[row] >= 0
        s, p = scores[row][valid], positions[row][valid]
        order = np.lexsort((p, -s))[:k]
        out_scores[row, : order.size] = s[order]
        out_positions[row, : order.size] = p[order]
    return SearchResult(positions=out_positions, scores=out_scores)


def merge_results(results: list[SearchResult], n: int, k: int) -> SearchResult:
    """Merge per-shard top-k lists into one (ties: earlier shard first, as one unsharded index orders them)."""
    if not results:
        return replace(SearchResult.empty(n, k), positions=None)
    scores = np.hstack([r.scores for r in results])
    ids = [sum((r.ids[row] for r in results), []) for row in range(n)]
    positions = np.where(np.isfinite(scores), np.arange(scores.shape[1])[None, :], -1)
    return named_per_row(top_k_candidates(scores, positions, k), ids)


def named_per_row(found: SearchResult, ids: list[list[str]]) -> SearchResult:
    """``found``'s positions looked up in each query's own id list (shard candidates differ per query)."""
    named = [[ids[row][p] if p >= 0 else None for p in found.positions[row]] for row in range(len(found))]
    return replace(found, ids=named, positions=None)
