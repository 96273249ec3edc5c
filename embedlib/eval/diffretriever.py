"""DiffRetriever as one retrieval system: encode a corpus with K_p mask slots, index it, search queries.

It is an evaluation ``System`` (``build(parts)``, ``search(queries, k) -> SearchResult``, ``bytes_per_doc()``,
``describe()``), offered by the evaluation job next to the dense systems.
With a ``router``, each query gets its own K (queries are encoded in groups of equal K).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embedlib import storage
from embedlib.encoding.representative_tokens import (
    DEFAULT_K_PASSAGE,
    DEFAULT_K_QUERY,
    DiffRetrieverEncoder,
    RepresentativeTokens,
)
from embedlib.eval.embeddings import PrefixCache
from embedlib.eval.systems import Part, System
from embedlib.search.adaptive_k import KRouter, UnigramModel
from embedlib.search.hybrid import DEFAULT_DENSE_WEIGHT, MODES, DiffRetrieverIndex, Mode, check_weight
from embedlib.search.results import SearchResult


@dataclass(frozen=True)
class DiffRetrieverSettings:
    """Search settings, validated on construction (errors name the field)."""

    k_query: int = DEFAULT_K_QUERY
    k_passage: int = DEFAULT_K_PASSAGE
    mode: Mode = "hybrid"
    dense_weight: float = DEFAULT_DENSE_WEIGHT
    candidates: int = 100
    batch_size: int = 32

    def __post_init__(self) -> None:
        for name in ("k_query", "k_passage", "candidates", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"DiffRetrieverSettings.{name} must be an integer >= 1, got {value!r}")
        if self.mode not in MODES:
            raise ValueError(f"DiffRetrieverSettings.mode must be one of {MODES}, got {self.mode!r}")
        check_weight(self.dense_weight)


class PassageEncodings:
    """A corpus encoded once with K_p mask tokens, shared by the systems (modes, K_q) of one model.

    A text list that is a prefix of one already encoded is not re-encoded (``PrefixCache``).
    """

    def __init__(self, encoder: DiffRetrieverEncoder, k_passage: int, batch_size: int = 32,
                 show_progress: bool = True):
        self.encoder, self.k_passage = encoder, k_passage
        self.batch_size, self.show_progress = batch_size, show_progress
        self._encoded = PrefixCache(most=1)  # multi-vectors are large: only the newest (largest) corpus is kept

    def get(self, texts: Sequence[str]) -> RepresentativeTokens:
        return self._encoded.get(texts, self._encode, lambda tokens, n: tokens.head(n))

    def _encode(self, texts: list[str]) -> RepresentativeTokens:
        return self.encoder.encode(texts, k=self.k_passage, kind="passage", batch_size=self.batch_size,
                                   show_progress=self.show_progress)


class DiffRetrieverSystem(System):
    """Representative-token multi-vector + sparse retrieval over a corpus given as ``(ids, texts)`` parts."""

    kind = "diffretriever"

    def __init__(
        self,
        name: str,
        encoder: DiffRetrieverEncoder,
        settings: DiffRetrieverSettings | None = None,
        router: KRouter | None = None,
        show_progress: bool = True,
        corpus: PassageEncodings | None = None,
    ):
        self.name = name
        self.encoder = encoder
        self.settings = settings or DiffRetrieverSettings()
        self.router = router
        self.show_progress = show_progress
        self.corpus = corpus or PassageEncodings(
            encoder, self.settings.k_passage, self.settings.batch_size, show_progress
        )
        if self.corpus.k_passage != self.settings.k_passage:
            raise ValueError(f"corpus encoded with k_passage={self.corpus.k_passage}, settings ask for "
                             f"{self.settings.k_passage}")
        self.ids: list[str] = []
        self.index: DiffRetrieverIndex | None = None
        self.unigram: UnigramModel | None = None

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "source": storage.redact_url(self.encoder.lm.source),
            "format": self.encoder.lm.format,
            **vars(self.settings),
            "router": None
            if self.router is None
            else {"ks": list(self.router.ks), "thresholds": list(self.router.thresholds)},
        }

    def build(self, parts: Sequence[Part]) -> None:
        self.ids = [doc_id for ids, _ in parts for doc_id in ids]
        texts = [text for _, part_texts in parts for text in part_texts]
        self.index = DiffRetrieverIndex.build(self.corpus.get(texts))
        if self.router is not None:
            self.unigram = UnigramModel(self.encoder.tokenizer, texts)

    def query_budgets(self, queries: Sequence[str]) -> np.ndarray:
        """K per query: the router's choice, else ``k_query`` for all."""
        if self.router is None:
            return np.full(len(queries), self.settings.k_query)
        return self.router.route(self.unigram.features(queries))

    def encode_queries(self, queries: Sequence[str]) -> list[tuple[np.ndarray, RepresentativeTokens]]:
        """``(positions, tokens)`` per group of queries sharing a K."""
        budgets = self.query_budgets(queries)
        groups = []
        for k in np.unique(budgets):
            rows = np.flatnonzero(budgets == k)
            tokens = self.encoder.encode(
                [queries[i] for i in rows], k=int(k), kind="query", batch_size=self.settings.batch_size
            )
            groups.append((rows, tokens))
        return groups

    def search(self, queries: Sequence[str], k: int) -> SearchResult:
        """Top-``k`` scores ``(n, k)`` float32 and document ids per query, best first."""
        if self.index is None:
            raise RuntimeError("DiffRetrieverSystem.search called before build")
        queries = list(queries)
        k = min(k, len(self.ids))
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        positions = np.full((len(queries), k), -1, dtype=np.int64)
        for rows, tokens in self.encode_queries(queries):
            found = self.index.search(
                tokens,
                k,
                mode=self.settings.mode,
                dense_weight=self.settings.dense_weight,
                candidates=max(self.settings.candidates, k),
            )
            positions[rows], scores[rows] = found.positions, found.scores
        return SearchResult(positions=positions, scores=scores).named(self.ids)

    def bytes_per_doc(self) -> float:
        if self.index is None:
            raise RuntimeError("DiffRetrieverSystem.bytes_per_doc called before build")
        return self.index.bytes_per_doc()["total"]
