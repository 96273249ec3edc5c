"""BM25 retrieval with bm25s: English stop words and Snowball stemming (PyStemmer), Lucene scoring."""

from __future__ import annotations

from collections.abc import Sequence

import bm25s
import numpy as np
import Stemmer

from embedlib.search.results import SearchResult


class BM25Index:
    """An in-memory BM25 index over ``texts`` whose hits are reported as positions into ``ids``."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str], k1: float = 1.5, b: float = 0.75,
                 show_progress: bool = False):
        if len(ids) != len(texts):
            raise ValueError(f"ids and texts differ in length: {len(ids)} != {len(texts)}")
        if not texts:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        self.ids = list(ids)
        self.show_progress = show_progress
        self._stemmer = Stemmer.Stemmer("english")
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index(self._tokenize(texts), show_progress=show_progress)

    def _tokenize(self, texts: Sequence[str]):
        return bm25s.tokenize(list(texts), stopwords="en", stemmer=self._stemmer, show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> SearchResult:
        """Top-``k`` documents (positions and ids) per query, best first; ``k`` is capped at the corpus size."""
        k = min(k, len(self.ids))
        positions, scores = self._bm25.retrieve(
            self._tokenize(queries), k=k, show_progress=self.show_progress, n_threads=0
        )
        return SearchResult(positions=positions.astype(np.int64), scores=scores.astype(np.float32)).named(self.ids)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of ``query`` against every indexed text, in index order."""
        tokens = bm25s.tokenize(
            [query], stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False
        )[0]
        return np.asarray(self._bm25.get_scores(tokens), dtype=np.float32)
