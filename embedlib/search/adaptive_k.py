"""Adaptive representative-token budget: choose K per query from cheap features (beyond the paper).

Features, computed from the query text alone (no forward pass):
- ``length``: the query's token count;
- ``token_entropy``: mean surprisal of its tokens, ``-log2 p(token)`` under the collection's unigram model
  (add-one smoothed), in bits per token: rare, specific words score high.
Their product is the query's information content in bits. The router is a rule on it: more information ->
more mask slots, ``K = ks[number of thresholds below the information]``. Thresholds are either the
quantiles of the queries' information (unsupervised) or fitted on training queries (grid search over
quantile pairs that maximises the mean metric of the routed K).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QueryFeatures:
    length: np.ndarray  # tokens per query
    token_entropy: np.ndarray  # bits per token

    @property
    def information(self) -> np.ndarray:
        return self.length * self.token_entropy


class UnigramModel:
    """Token frequencies of a collection, for token surprisal."""

    def __init__(self, tokenizer, texts: Sequence[str], vocab_size: int | None = None):
        self.tokenizer = tokenizer
        size = vocab_size or len(tokenizer)
        counts = np.ones(size, dtype=np.float64)
        for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
            np.add.at(counts, [i for i in ids if i < size], 1.0)
        self.surprisal = -np.log2(counts / counts.sum())

    def features(self, queries: Sequence[str]) -> QueryFeatures:
        encoded = self.tokenizer(list(queries), add_special_tokens=False)["input_ids"]
        length = np.array([len(ids) for ids in encoded], dtype=np.float64)
        entropy = np.array([self.surprisal[ids].mean() if ids else 0.0 for ids in encoded], dtype=np.float64)
        return QueryFeatures(length=length, token_entropy=entropy)


@dataclass(frozen=True)
class KRouter:
    """``K = ks[i]`` where ``i`` is how many ``thresholds`` (bits) the query's information exceeds."""

    ks: tuple[int, ...]
    thresholds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.thresholds) != len(self.ks) - 1:
            raise ValueError(
                f"KRouter needs len(ks) - 1 = {len(self.ks) - 1} thresholds, got {len(self.thresholds)}"
            )
        if list(self.ks) != sorted(set(self.ks)) or list(self.thresholds) != sorted(self.thresholds):
            raise ValueError(f"KRouter ks {self.ks} and thresholds {self.thresholds} must be increasing")

    def route(self, features: QueryFeatures) -> np.ndarray:
        return np.array([self.ks[bisect.bisect_right(self.thresholds, x)] for x in features.information])

    @classmethod
    def from_quantiles(cls, ks: Sequence[int], features: QueryFeatures) -> KRouter:
        """Equal-sized groups: the shortest/least informative queries get the smallest K."""
        ks = tuple(sorted(ks))
        levels = np.linspace(0, 1, len(ks) + 1)[1:-1]
        return cls(ks, tuple(float(q) for q in np.quantile(features.information, levels)))

    @classmethod
    def fit(
        cls, ks: Sequence[int], features: QueryFeatures, metric_by_k: Mapping[int, np.ndarray], grid: int = 11
    ) -> KRouter:
        """Thresholds (from a quantile grid) maximising the mean of ``metric_by_k[K][query]`` of the routed K."""
        ks = tuple(sorted(ks))
        candidates = sorted(set(np.quantile(features.information, np.linspace(0, 1, grid)).tolist()))
        best, best_value = None, -np.inf
        for thresholds in itertools.combinations_with_replacement(candidates, len(ks) - 1):
            router = cls(ks, tuple(thresholds))
            value = routed_metric(router.route(features), metric_by_k).mean()
            if value > best_value + 1e-12:
                best, best_value = router, value
        return best


def routed_metric(chosen: np.ndarray, metric_by_k: Mapping[int, np.ndarray]) -> np.ndarray:
    """Per query, the metric of the K chosen for it."""
    return np.array([metric_by_k[int(k)][row] for row, k in enumerate(chosen)])


def oracle_choice(metric_by_k: Mapping[int, np.ndarray]) -> np.ndarray:
    """Per query, the K with the best metric (the smallest such K on ties)."""
    ks = sorted(metric_by_k)
    table = np.stack([metric_by_k[k] for k in ks])
    return np.array(ks)[np.argmax(table, axis=0)]


def budget_report(metric_by_k: Mapping[int, np.ndarray], routed: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """Mean metric and mean K of every fixed K, each routed choice, and the per-query oracle."""
    report = {
        f"fixed K={k}": {"metric": float(np.mean(v)), "mean_k": float(k)}
        for k, v in sorted(metric_by_k.items())
    }
    for name, chosen in routed.items():
        report[name] = {
            "metric": float(routed_metric(chosen, metric_by_k).mean()),
            "mean_k": float(np.mean(chosen)),
        }
    oracle = oracle_choice(metric_by_k)
    report["oracle"] = {
        "metric": float(routed_metric(oracle, metric_by_k).mean()),
        "mean_k": float(np.mean(oracle)),
    }
    return report
