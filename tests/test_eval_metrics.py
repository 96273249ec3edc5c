"""Metrics against hand-computed rankings, Q2Q self-exclusion, ANN overlap, distractor paragraphs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embedlib.eval.distractors import load_distractors, paragraph_windows
from embedlib.eval.metrics import evaluate_run, paired_bootstrap, run_from_hits, top_k_overlap
from embedlib.eval.run import scale_sizes
from embedlib.search.results import SearchResult


def log2(x: float) -> float:
    return math.log(x, 2)


def test_binary_relevance_metrics_match_hand_computation():
    qrels = {"q1": {"d1": 1, "d2": 1}}
    run = {"q1": {"d3": 4.0, "d1": 3.0, "d4": 2.0, "d2": 1.0}}  # ranking: d3, d1, d4, d2
    means, per_query = evaluate_run(qrels, run, k_values=(1, 2, 4))
    ideal = 1 + 1 / log2(3)
    assert per_query["q1"]["recall@1"] == 0.0
    assert per_query["q1"]["recall@2"] == pytest.approx(0.5)
    assert per_query["q1"]["recall@4"] == pytest.approx(1.0)
    assert per_query["q1"]["mrr@1"] == 0.0
    assert per_query["q1"]["mrr@2"] == pytest.approx(0.5)
    assert per_query["q1"]["ndcg@2"] == pytest.approx((1 / log2(3)) / ideal)
    assert per_query["q1"]["ndcg@4"] == pytest.approx((1 / log2(3) + 1 / log2(5)) / ideal)
    assert means == per_query["q1"]


def test_paired_bootstrap_interval_is_tight_for_a_steady_change_and_spans_zero_for_one_outlier():
    base = {f"q{i}": 0.5 for i in range(100)}
    steady = {q: v + 0.1 for q, v in base.items()}
    assert paired_bootstrap(base, steady) == pytest.approx((0.1, 0.1, 0.1))
    one_query = {**base, "q7": 1.5}  # +1 on 1 query of 100: a mean of +0.01 that a resample often misses
    change, low, high = paired_bootstrap(base, one_query)
    assert change == pytest.approx(0.01) and low == 0.0 and 0.02 < high < 0.05
    mixed = {q: v + (0.3 if i % 2 else -0.3) for i, (q, v) in enumerate(base.items())}
    change, low, high = paired_bootstrap(base, {**mixed, "extra": 1.0})  # a query only one run has is left out
    assert change == pytest.approx(0.0, abs=1e-12) and low < -0.04 and high > 0.04
    with pytest.raises(ValueError, match="share no query"):
        paired_bootstrap({"a": 1.0}, {"b": 1.0})


def test_graded_relevance_uses_linear_gain_as_trec_eval_does():
    qrels = {"q": {"a": 2, "b": 1}}
    run = {"q": {"b": 2.0, "a": 1.0}}
    means, _ = evaluate_run(qrels, run, k_values=(10,))
    assert means["ndcg@10"] == pytest.approx((1 + 2 / log2(3)) / (2 + 1 / log2(3)))


def test_means_average_over_queries_and_missing_hits_score_zero():
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 1}}
    run = {"q1": {"d1": 1.0}, "q2": {"d1": 1.0}}
    means, per_query = evaluate_run(qrels, run, k_values=(10,))
    assert per_query["q2"]["recall@10"] == 0.0
    assert means["recall@10"] == pytest.approx(0.5)
    assert means["mrr@10"] == pytest.approx(0.5)


def test_q2q_run_never_contains_the_query_itself_and_keeps_k_hits():
    ids = [["q1", "a", "b", "c"], ["x", "q2", "y", "z"]]
    found = SearchResult(ids=ids, scores=np.array([[4, 3, 2, 1], [4, 3, 2, 1]], dtype=np.float32))
    run = run_from_hits(["q1", "q2"], found, k=3, ignore_identical_ids=True)
    assert run == {"q1": {"a": 3.0, "b": 2.0, "c": 1.0}, "q2": {"x": 4.0, "y": 2.0, "z": 1.0}}
    plain = run_from_hits(["q1", "q2"], found, k=3)
    assert "q1" in plain["q1"] and "q2" in plain["q2"]


def test_self_hit_would_inflate_q2q_recall():
    qrels = {"q1": {"q1": 1, "a": 1}}  # a (wrongly) self-judged query: only the rule keeps it honest
    found = SearchResult(ids=[["q1", "b", "a"]], scores=np.array([[3, 2, 1]], dtype=np.float32))
    honest, _ = evaluate_run(qrels, run_from_hits(["q1"], found, 1, ignore_identical_ids=True), (1,))
    inflated, _ = evaluate_run(qrels, run_from_hits(["q1"], found, 1), (1,))
    assert honest["recall@1"] == 0.0 and inflated["recall@1"] == 0.5


def test_top_k_overlap_counts_shared_hits():
    exact = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    ann = {"q": {"a": 3.0, "c": 2.5, "d": 2.0}}
    assert top_k_overlap(ann, exact, 2) == pytest.approx(0.5)
    assert top_k_overlap(exact, exact, 3) == 1.0


def test_paragraph_windows_split_blocks_and_drop_short_ones():
    text = "one two three four five six seven eight nine ten\n\nshort block\n\n" + " ".join(["w"] * 25)
    windows = list(paragraph_windows(text, max_words=10, min_words=5))
    assert windows[0] == "one two three four five six seven eight nine ten"
    assert [len(w.split()) for w in windows] == [10, 10, 10, 5]


def test_distractors_are_deterministic_prefixes_and_shortfall_is_an_error(shared_data):
    source = str(shared_data / "text" / "gutenberg" / "blake-poems.txt")
    small, large = load_distractors(source, 20), load_distractors(source, 50)
    assert large[:20] == small
    with pytest.raises(ValueError, match="blake-poems.txt: holds"):
        load_distractors(source, 10**7)


def test_scale_sizes_grow_the_corpus_by_the_factor():
    assert scale_sizes(100, [10, 1, 2.5]) == [(1, 0), (2.5, 150), (10, 900)]
    with pytest.raises(ValueError, match="scale"):
        scale_sizes(100, [0.5])


def test_run_from_named_positions_skips_fills():
    found = SearchResult(positions=np.array([[2, 0, -1]]), scores=np.array([[0.75, 0.5, -np.inf]], np.float32))
    assert run_from_hits(["q"], found.named(["a", "b", "c"])) == {"q": {"c": 0.75, "a": 0.5}}


def test_search_result_cannot_be_unpacked_as_a_pair():
    found = SearchResult.empty(1, 2)
    with pytest.raises(TypeError):
        scores, ids = found
