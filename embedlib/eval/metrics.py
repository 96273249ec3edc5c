"""Retrieval metrics with pytrec_eval, computed as BEIR/MTEB compute them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytrec_eval

from embedlib.search.results import SearchResult

Run = dict[str, dict[str, float]]  # query id -> {doc id: score}


def evaluate_run(
    qrels: dict[str, dict[str, int]], run: Run, k_values: Sequence[int] = (10, 100, 1000)
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Mean and per-query ``ndcg@k``, ``mrr@k``, ``recall@k`` over the judged queries of ``run``.

    MRR@k is computed from the ranking as MTEB does (reciprocal rank of the first relevant hit in top-k).
    """
    qrels = {qid: docs for qid, docs in qrels.items() if qid in run}
    cutoffs = ",".join(str(k) for k in k_values)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {f"ndcg_cut.{cutoffs}", f"recall.{cutoffs}"})
    raw = evaluator.evaluate(run)
    per_query: dict[str, dict[str, float]] = {}
    for qid, values in raw.items():
        row = {}
        for k in k_values:
            row[f"ndcg@{k}"] = values[f"ndcg_cut_{k}"]
            row[f"recall@{k}"] = values[f"recall_{k}"]
            row[f"mrr@{k}"] = reciprocal_rank(run[qid], qrels[qid], k)
        per_query[qid] = row
    keys = next(iter(per_query.values())).keys() if per_query else []
    means = {key: float(np.mean([row[key] for row in per_query.values()])) for key in keys}
    return means, per_query


def paired_bootstrap(
    first: dict[str, float], second: dict[str, float], samples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """The mean per-query change ``second - first`` over their common queries, and its 95% interval from
    resampling those queries with replacement (paired bootstrap)."""
    common = sorted(first.keys() & second.keys())
    if not common:
        raise ValueError("paired_bootstrap: the two runs share no query")
    change = np.array([second[q] - first[q] for q in common])
    draws = np.random.default_rng(seed).integers(0, len(change), size=(samples, len(change)))
    low, high = np.percentile(change[draws].mean(axis=1), [2.5, 97.5])
    return float(change.mean()), float(low), float(high)


def reciprocal_rank(hits: dict[str, float], relevant: dict[str, int], k: int) -> float:
    ranked = sorted(hits.items(), key=lambda item: -item[1])[:k]
    for rank, (did, _) in enumerate(ranked, start=1):
        if relevant.get(did, 0) > 0:
            return 1.0 / rank
    return 0.0


def run_from_hits(
    query_ids: Sequence[str], found: SearchResult, k: int | None = None, ignore_identical_ids: bool = False
) -> Run:
    """A pytrec_eval run from a named search result, cut to ``k`` hits per query (all by default).

    With ``ignore_identical_ids`` a query's own id is never a hit (BEIR's rule for query-to-query sets).
    """
    run: Run = {}
    k = found.scores.shape[1] if k is None else k
    if found.ids is None:
        raise ValueError("run_from_hits needs a result with ids (SearchResult.named)")
    for qid, ids, row in zip(query_ids, found.ids, found.scores, strict=True):
        hits: dict[str, float] = {}
        for did, score in zip(ids, row, strict=True):
            if len(hits) == k:
                break
            if did is None or (ignore_identical_ids and did == qid):
                continue
            hits.setdefault(did, float(score))
        run[qid] = hits
    return run


def top_k_overlap(run: Run, reference: Run, k: int) -> float:
    """Mean fraction of ``reference``'s top-``k`` hits that ``run`` also has in its top-``k`` (ANN recall)."""
    fractions = []
    for qid, expected in reference.items():
        want = {d for d, _ in sorted(expected.items(), key=lambda item: -item[1])[:k]}
        got = {d for d, _ in sorted(run.get(qid, {}).items(), key=lambda item: -item[1])[:k]}
        if want:
            fractions.append(len(want & got) / len(want))
    return float(np.mean(fractions)) if fractions else float("nan")
