"""DiffRetriever scoring and indexes: MaxSim, sparse inverted index, hybrid fusion, adaptive K router."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from embedlib.encoding.representative_tokens import RepresentativeTokens
from embedlib.search.adaptive_k import KRouter, QueryFeatures, UnigramModel, budget_report, oracle_choice
from embedlib.search.hybrid import DiffRetrieverIndex, exhaustive_scores, hybrid_scores, minmax_rows
from embedlib.search.multivector import STORED_DTYPE, MultiVectorIndex, maxsim_scores, top_k
from embedlib.search.sparse import SparseIndex, quantize_weights, sparse_scores

RNG = np.random.default_rng(0)


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def random_tokens(
    n: int, k: int, dim: int = 16, vocab: int = 300, terms: int = 20, seed: int = 0
) -> RepresentativeTokens:
    rng = np.random.default_rng(seed)
    dense = [unit(rng.normal(size=(int(k if k else rng.integers(1, 6)), dim))) for _ in range(n)]
    rows = [rng.choice(vocab, size=terms, replace=False) for _ in range(n)]
    sparse = sp.csr_matrix(
        (
            rng.gamma(2.0, 1.0, size=n * terms).astype(np.float32),
            (np.repeat(np.arange(n), terms), np.concatenate(rows)),
        ),
        shape=(n, vocab),
    )
    return RepresentativeTokens(dense=dense, sparse=sparse, k=k)


def brute_maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    return sum(max(max(float(q @ d), 0.0) for d in doc) for q in query)


def test_maxsim_matches_its_definition_and_is_clamped_at_zero():
    docs = random_tokens(30, 0).dense  # varying numbers of vectors per document
    queries = random_tokens(5, 3, seed=1).dense
    scores = maxsim_scores(queries, docs)
    expected = np.array([[brute_maxsim(q, d) for d in docs] for q in queries])
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    opposite = maxsim_scores([-docs[0][:1]], [docs[0][:1]])
    assert opposite[0, 0] == 0.0


def test_top_k_returns_best_first():
    scores = RNG.normal(size=(4, 50)).astype(np.float32)
    best = top_k(scores, 7)
    np.testing.assert_array_equal(best.positions, np.argsort(-scores, axis=1)[:, :7])
    np.testing.assert_allclose(best.scores, -np.sort(-scores, axis=1)[:, :7])


def as_stored(dense: list[np.ndarray]) -> list[np.ndarray]:
    """Document vectors as the index stores them (float16), back in float32."""
    return [d.astype(STORED_DTYPE).astype(np.float32) for d in dense]


def test_multivector_index_with_full_candidates_equals_exhaustive_maxsim(tmp_path):
    docs, queries = random_tokens(200, 8), random_tokens(6, 4, seed=2)
    index = MultiVectorIndex(docs.dense)
    assert index.faiss.ntotal == 200 * 8
    found = index.search(queries.dense, k=10, vectors_per_query_vector=index.faiss.ntotal)
    expected = top_k(maxsim_scores(queries.dense, as_stored(docs.dense)), 10)
    np.testing.assert_array_equal(found.positions, expected.positions)
    np.testing.assert_allclose(found.scores, expected.scores, rtol=1e-5)
    # Candidate generation from a few nearest vectors still reranks exactly.
    few = index.search(queries.dense, k=5, vectors_per_query_vector=8)
    exact = maxsim_scores(queries.dense, as_stored(docs.dense))
    np.testing.assert_allclose(few.scores, np.take_along_axis(exact, few.positions, axis=1), rtol=1e-5)
    assert index.vectors.dtype == np.float16
    assert index.bytes_per_doc() >= 2 * 8 * 16 * 2  # the stored float16 vectors and FAISS' own fp16 copy


def test_indexes_round_trip_through_s3(s3_bucket):
    docs, queries = random_tokens(80, 4), random_tokens(5, 2, seed=3)
    index = DiffRetrieverIndex.build(docs)
    index.save(f"{s3_bucket}/diffretriever")
    loaded = DiffRetrieverIndex.load(f"{s3_bucket}/diffretriever")
    for mode in ("dense", "sparse", "hybrid"):
        a, b = index.search(queries, 10, mode=mode), loaded.search(queries, 10, mode=mode)
        np.testing.assert_array_equal(a.positions, b.positions)
    with pytest.raises(FileNotFoundError, match="manifest"):
        DiffRetrieverIndex.load(f"{s3_bucket}/nothing-here")


def test_sparse_index_scores_with_integer_weights_close_to_float_scores():
    docs, queries = random_tokens(150, 4), random_tokens(8, 2, seed=4)
    index = SparseIndex(docs.sparse, scale=100)
    assert index.postings.dtype == np.uint16
    exact = sparse_scores(queries.sparse, docs.sparse)
    quantized = index.scores(queries.sparse)
    bound = np.asarray(queries.sparse.sum(axis=1)) * 0.5 / 100  # half a quantization step per matched term
    assert (np.abs(quantized - exact) <= bound + 1e-5).all()
    positions = index.search(queries.sparse, 5).positions
    disjoint = exact[np.arange(len(exact))[:, None], positions] > 0
    assert disjoint.all()
    with pytest.raises(ValueError, match="vocabulary"):
        index.scores(sp.csr_matrix((1, 10), dtype=np.float32))


def test_quantization_refuses_negative_or_overflowing_weights():
    with pytest.raises(ValueError, match="non-negative"):
        quantize_weights(sp.csr_matrix(np.array([[-1.0, 2.0]])))
    with pytest.raises(ValueError, match="uint16"):
        quantize_weights(sp.csr_matrix(np.array([[1000.0, 2.0]])))


def test_hybrid_normalises_per_query_and_interpolates():
    dense = RNG.normal(size=(3, 20)).astype(np.float32) * 10 + 5
    sparse = RNG.gamma(2.0, size=(3, 20)).astype(np.float32)
    normalised = minmax_rows(dense)
    np.testing.assert_allclose(normalised.min(axis=1), 0)
    np.testing.assert_allclose(normalised.max(axis=1), 1)
    np.testing.assert_array_equal(np.argsort(hybrid_scores(dense, sparse, 1.0)), np.argsort(dense))
    np.testing.assert_array_equal(np.argsort(hybrid_scores(dense, sparse, 0.0)), np.argsort(sparse))
    np.testing.assert_allclose(
        hybrid_scores(dense, sparse), 0.5 * minmax_rows(dense) + 0.5 * minmax_rows(sparse)
    )
    assert (minmax_rows(np.ones((1, 4))) == 0).all()
    with pytest.raises(ValueError, match="dense_weight"):
        hybrid_scores(dense, sparse, 1.5)


def test_index_hybrid_search_equals_exhaustive_hybrid_when_candidates_cover_the_corpus():
    docs, queries = random_tokens(60, 4), random_tokens(5, 2, seed=5)
    index = DiffRetrieverIndex.build(docs)
    found = index.search(queries, 10, mode="hybrid", candidates=60)
    # The index's sparse side holds integer-quantized weights; exhaustive hybrid over the same scores:
    exhaustive = hybrid_scores(maxsim_scores(queries.dense, as_stored(docs.dense)), index.sparse.scores(queries.sparse))
    expected = top_k(exhaustive, 10)
    float_hybrid = exhaustive_scores(queries, docs, "hybrid")
    assert np.abs(float_hybrid - exhaustive).max() < 0.01
    np.testing.assert_array_equal(found.positions, expected.positions)
    np.testing.assert_allclose(found.scores, expected.scores, rtol=1e-5, atol=1e-6)
    sizes = index.bytes_per_doc()
    assert sizes["total"] == sizes["dense"] + sizes["sparse"] > 0


def test_router_routes_by_information_and_fitting_beats_fixed_budgets():
    rng = np.random.default_rng(7)
    length = rng.integers(2, 40, size=300).astype(float)
    features = QueryFeatures(length=length, token_entropy=np.full(300, 8.0))
    # Synthetic metric: short queries are best with K=1, long ones with K=16, middle ones with K=4.
    metric_by_k = {
        1: (length < 12).astype(float),
        4: ((length >= 12) & (length < 25)).astype(float),
        16: (length >= 25).astype(float),
    }
    fitted = KRouter.fit((1, 4, 16), features, metric_by_k)
    report = budget_report(metric_by_k, {"fitted": fitted.route(features)})
    best_fixed = max(report[f"fixed K={k}"]["metric"] for k in (1, 4, 16))
    assert report["fitted"]["metric"] > best_fixed
    assert report["oracle"]["metric"] == pytest.approx(1.0)
    assert report["oracle"]["metric"] >= report["fitted"]["metric"]
    quantile = KRouter.from_quantiles((1, 4, 16), features).route(features)
    assert set(np.unique(quantile)) == {1, 4, 16}
    assert (quantile[np.argsort(length)] == np.sort(quantile)).all()  # monotone in information
    np.testing.assert_array_equal(oracle_choice({1: np.zeros(2), 4: np.zeros(2)}), [1, 1])
    with pytest.raises(ValueError, match="thresholds"):
        KRouter((1, 4), (1.0, 2.0))


def test_unigram_features_rate_rare_words_as_more_informative():
    from embedlib.models.tiny import train_bpe_tokenizer

    corpus = ["the flow of the air over the wing"] * 50 + ["hypersonic ablation"]
    tokenizer = train_bpe_tokenizer(corpus * 4, vocab_size=300)
    unigram = UnigramModel(tokenizer, corpus)
    features = unigram.features(["the flow", "hypersonic ablation", ""])
    assert features.token_entropy[1] > features.token_entropy[0]
    assert features.length[2] == 0 and features.information[2] == 0
