"""Issue 13: multi-source training data, the binary straight-through term, and the dev-chosen merge."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from conftest import perturbed_copy, write_beir_subset

from embedlib.config import ConfigError, from_dict
from embedlib.encoding.formats import asymmetric_binary_similarity, binary_queries, similarity
from embedlib.encoding.quantize import binary_straight_through, quantize_binary
from embedlib.objectives.contrastive import (
    both,
    cosine,
    cosine_matrix,
    matryoshka,
    not_judged_relevant,
    pair_loss,
    same_document,
    same_source_other_query,
)
from embedlib.training.config import MergeConfig, SourceConfig, TrainConfig
from embedlib.training.merge import best_weight, guard_change, guard_limit, lerp, sweep
from embedlib.training.mixture import (
    build_mixture,
    heldout_dataset,
    mixture_rows,
    read_source,
    unseen_dataset,
    with_negatives,
)
from embedlib.training.stages import ContrastiveCollator


def train_config(sources: list[dict], anchor_weight: float = 0.0, **data) -> TrainConfig:
    return from_dict(
        TrainConfig,
        {"stage": "pair", "model": "m", "output": "o", "batch_size": 8, "anchor_weight": anchor_weight,
         "data": {"url": "rows.parquet", "sources": sources, **data}},
    )


@pytest.mark.parametrize(
    ("sources", "field"),
    [
        ([{"name": "a", "kind": "beir", "url": "x", "weight": 0}], "data.sources[0].weight"),
        ([{"name": "a", "kind": "beir", "url": "x"}, {"name": "a", "kind": "q2q", "url": "y"}], "data.sources[1].name"),
        ([{"name": "a", "kind": "spans", "url": "x", "holdout": 0.2}], "data.sources[0].holdout"),
        ([{"name": "a", "kind": "web", "url": "x"}], "data.sources[0].kind"),
        ([{"name": "a", "kind": "beir", "url": "x", "weigth": 1}], "data.sources[0].weigth"),
        ([{"name": "a", "kind": "beir", "url": "x", "negatives_skip_top": -1}], "data.sources[0].negatives_skip_top"),
    ],
)
def test_mixture_config_errors_name_the_field(sources, field):
    with pytest.raises(ConfigError, match="^" + re.escape(field) + ":"):
        train_config(sources)


def test_anchor_only_sources_need_the_anchor_same_source_batches_and_a_source_that_trains():
    replay = {"name": "r", "kind": "spans", "url": "x", "loss": "anchor"}
    trained = {"name": "a", "kind": "beir", "url": "x"}
    for sources, fields, message in (
        ([trained, replay], {}, r"^data\.sources\[1\]\.loss: an anchor-only source needs anchor_weight > 0"),
        ([trained, replay], {"anchor_weight": 1.0, "same_source_batches": False},
         r"^data\.sources\[1\]\.loss: an anchor-only source needs data\.same_source_batches"),
        ([replay], {"anchor_weight": 1.0}, r"^data\.sources: every source is anchor-only"),
        ([{**trained, "loss": "none"}], {}, r"^data\.sources\[0\]\.loss"),
    ):
        with pytest.raises(ConfigError, match=message):
            train_config(sources, **fields)
    assert train_config([trained, replay], anchor_weight=1.0).data.sources[1].loss == "anchor"


def test_merge_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"^dev:"):
        from_dict(MergeConfig, {"first": "a", "second": "b", "output": "c", "sweep": [0.5]})
    with pytest.raises(ConfigError, match=r"^sweep\[1\]:"):
        from_dict(MergeConfig, {"first": "a", "second": "b", "output": "c", "sweep": [0.5, 1.5],
                                "dev": [{"name": "d", "kind": "beir", "url": "x", "holdout": 0.2}]})
    dev = [{"name": "d", "kind": "beir", "url": "x", "holdout": 0.2}]
    for keep_gain, weights in ((1.5, [0.0, 1.0]), (0.5, [0.5, 1.0])):
        with pytest.raises(ConfigError, match=r"^keep_gain:"):
            from_dict(MergeConfig, {"first": "a", "second": "b", "output": "c", "sweep": weights, "dev": dev,
                                    "keep_gain": keep_gain})
    for fields, field in (({"binary_centre_docs": -1}, "binary_centre_docs"),
                          ({"binary_centre_docs": 8}, "binary_centre_data"),
                          ({"binary_centre_data": "rows.parquet"}, "binary_centre_docs")):
        with pytest.raises(ConfigError, match="^" + field + ":"):
            from_dict(MergeConfig, {"first": "a", "second": "b", "output": "c", **fields})
    guard = [{"name": "g", "kind": "spans", "url": "x"}]
    for fields, field in (({}, "guard"), ({"sweep": [0.5, 1.0], "dev": dev}, "guard"),
                          ({"sweep": [0.0, 1.0], "dev": dev, "guard_tolerance": -0.1}, "guard_tolerance"),
                          ({"sweep": [0.0, 1.0], "dev": dev, "guard_rule": "ttest"}, "guard_rule"),
                          ({"sweep": [0.0, 1.0], "dev": dev, "guard": [*guard, *guard]}, r"guard\[1\]\.name"),
                          ({"sweep": [0.0, 1.0], "dev": dev, "guard": [{**guard[0], "name": "d"}]}, r"guard\[0\]\.name")):
        with pytest.raises(ConfigError, match="^" + field + ":"):
            from_dict(MergeConfig, {"first": "a", "second": "b", "output": "c", "guard": guard, **fields})


def test_mixture_follows_weights_in_same_source_batches():
    sources = [SourceConfig(name=n, kind="beir", url="x", weight=w) for n, w in (("a", 2.0), ("b", 1.0), ("c", 1.0))]
    per_source = [[{"query": f"{n}{i}", "positive": "p", "query_id": str(i), "doc_id": str(i)} for i in range(10)]
                  for n in "abc"]
    rows = mixture_rows(sources, per_source, rows=160, batch_size=8, seed=1)
    counts = {n: sum(r["source"] == n for r in rows) for n in "abc"}
    assert counts == {"a": 80, "b": 40, "c": 40}
    batches = [rows[i : i + 8] for i in range(0, len(rows), 8)]
    assert all(len({r["source"] for r in batch}) == 1 for batch in batches)
    assert [b[0]["source"] for b in batches] != sorted(b[0]["source"] for b in batches)  # batches interleaved
    assert all(r["query"].startswith(r["source"]) for r in rows)


def test_anchor_only_rows_are_tagged_in_batches_of_their_own():
    sources = [SourceConfig(name="a", kind="beir", url="x"), SourceConfig(name="r", kind="spans", url="y", loss="anchor")]
    per_source = [[{"query": f"{n}{i}", "positive": "p", "query_id": str(i), "doc_id": str(i)} for i in range(10)]
                  for n in "ar"]
    rows = mixture_rows(sources, per_source, rows=64, batch_size=8, seed=0)
    assert {(r["source"], r["anchor_only"]) for r in rows} == {("a", False), ("r", True)}
    assert all(len({r["anchor_only"] for r in rows[i : i + 8]}) == 1 for i in range(0, len(rows), 8))
    assert "anchor_only" not in mixture_rows(sources[:1], per_source[:1], rows=16, batch_size=8)[0]


def test_quora_training_pairs_never_touch_the_heldout_groups(shared_data):
    source = SourceConfig(name="quora", kind="q2q", url=str(shared_data / "quora-q2q"), split="test", holdout=0.5)
    data = read_source(source)
    heldout = heldout_dataset(source)
    trained = {p["query_id"] for p in data.pairs} | {p["doc_id"] for p in data.pairs}
    evaluated = set(heldout.qrels) | {d for docs in heldout.qrels.values() for d in docs}
    assert data.pairs and heldout.qrels
    assert not trained & evaluated
    assert len(heldout.corpus) == len(data.pool.corpus)  # the evaluation pool is every question
    triplets = with_negatives(dataclasses.replace(data, pairs=data.pairs[:50]), k=2)
    assert all(t["query_id"] not in t["negative_ids"] for t in triplets)  # a question is never its own negative
    assert all(not set(t["negative_ids"]) & set(data.pool.qrels[t["query_id"]]) for t in triplets)


def test_beir_holdout_and_graded_positives(shared_data):
    source = SourceConfig(name="nf", kind="beir", url=str(shared_data / "nfcorpus-dev"), split="dev",
                          holdout=0.2, min_relevance=2)
    data = read_source(source)
    heldout = heldout_dataset(source, max_docs=300)
    assert not {p["query_id"] for p in data.pairs} & set(heldout.qrels)
    assert all(data.pool.qrels[p["query_id"]][p["doc_id"]] >= 2 for p in data.pairs)
    assert len(heldout.corpus) == 300
    assert 0.1 < len(heldout.qrels) / len(data.pool.qrels) < 0.3
    # Every document judged relevant to the query, at any grade, travels with the pair (never a negative).
    for pair in data.pairs[:50]:
        assert pair["relevant_ids"] == sorted(d for d, g in data.pool.qrels[pair["query_id"]].items() if g > 0)
    assert any(len(p["relevant_ids"]) > 1 for p in data.pairs)
    # negatives_skip_top: the negative is the one that many places further down the same BM25 ranking.
    few = dataclasses.replace(data, pairs=data.pairs[:40])
    top = {(r["query_id"], r["doc_id"]): r["negative_ids"] for r in with_negatives(few, 6)}
    skipped = with_negatives(few, 1, skip_top=5)
    assert len(skipped) >= 30
    for row in skipped:
        assert not set(row["negative_ids"]) & set(row["relevant_ids"])
        if (row["query_id"], row["doc_id"]) in top:
            assert row["negative_ids"] == top[row["query_id"], row["doc_id"]][5:6]


def test_neighbouring_spans(tmp_path):
    words = [f"w{i}" for i in range(1000)]
    (tmp_path / "book.txt").write_text("\n".join(" ".join(words[i : i + 7]) for i in range(0, 1000, 7)))
    source = SourceConfig(name="text", kind="spans", url=str(tmp_path), max_pairs=5)
    data = read_source(source)
    assert len(data.pairs) == 5
    for pair in data.pairs:
        query, positive = pair["query"].split(), pair["positive"].split()
        assert (len(query), len(positive)) == (32, 96)
        assert int(positive[0][1:]) == int(query[-1][1:]) + 1  # the span right after the query
    rows = build_mixture([source], rows=None, batch_size=1, hard_negatives=2)
    assert all(r["doc_id"] not in r["negative_ids"] and r["source"] == "text" for r in rows)
    assert rows and all(len(r["negatives"]) == 2 for r in rows)
    replay = dataclasses.replace(source, name="replay", loss="anchor")
    rows = build_mixture([source, replay], rows=None, batch_size=1, hard_negatives=2)
    replayed = [r for r in rows if r["source"] == "replay"]
    assert len(replayed) == 5 and all(r["negatives"] == r["negative_ids"] == [] for r in replayed)  # nothing mined
    guard = unseen_dataset(source, max_docs=6)  # the span pairs as a dev set: each query judges its next span
    assert sorted(guard.qrels) == sorted(p["query_id"] for p in data.pairs)
    assert len(guard.corpus) == 6 and all(set(docs) <= set(guard.corpus) for docs in guard.qrels.values())


def test_unseen_dataset_keeps_the_heldout_split_unseen(shared_data):
    source = SourceConfig(name="quora", kind="q2q", url=str(shared_data / "quora-q2q"), split="test", holdout=0.5)
    guard, heldout = unseen_dataset(source), heldout_dataset(source)
    assert guard.qrels and not set(guard.qrels) & set(heldout.qrels)
    assert not {d for docs in guard.qrels.values() for d in docs} & set(heldout.qrels)  # duplicates too
    assert len(guard.qrels) + len(heldout.qrels) == len(read_source(source).pool.qrels)


def test_in_batch_negatives_stay_within_source_and_skip_the_same_query():
    sources = torch.tensor([1, 1, 2, 2, 2])
    queries = torch.tensor([10, 10, 20, 21, 22])
    keep = same_source_other_query(sources, queries)
    expected = torch.tensor([
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1],
        [0, 0, 1, 0, 1],
        [0, 0, 1, 1, 0],
    ], dtype=torch.bool)
    assert torch.equal(keep, expected)
    # With the source mask, a mixed batch's loss is the size-weighted mean of each source's own batch loss.
    generator = torch.Generator().manual_seed(0)
    q, d = torch.randn(6, 16, generator=generator), torch.randn(6, 16, generator=generator)
    src = torch.tensor([1, 1, 1, 2, 2, 2])
    mixed = pair_loss(q, d, 0.05, None, None, same_source_other_query(src, None))
    separate = (pair_loss(q[:3], d[:3], 0.05, None) + pair_loss(q[3:], d[3:], 0.05, None)) / 2
    assert torch.allclose(mixed, separate)
    assert not torch.allclose(pair_loss(q, d, 0.05, None), separate)


def test_documents_judged_relevant_to_a_query_are_not_its_in_batch_negatives():
    doc_keys = torch.tensor([100, 101, 102, 103])
    relevant = torch.tensor([[100, 102], [101, 101], [102, 100], [103, 103]])  # row 0 and row 2 share judgements
    keep = not_judged_relevant(relevant, doc_keys)
    expected = torch.tensor([
        [0, 1, 0, 1],
        [1, 0, 1, 1],
        [0, 1, 0, 1],
        [1, 1, 1, 0],
    ], dtype=torch.bool)
    assert torch.equal(keep, expected)
    assert torch.equal(both(keep, None), keep) and both(None, None) is None
    generator = torch.Generator().manual_seed(0)
    q, d = torch.randn(4, 16, generator=generator), torch.randn(4, 16, generator=generator)
    masked = pair_loss(q, d, 0.05, None, None, keep)
    assert not torch.allclose(masked, pair_loss(q, d, 0.05, None))
    # The collator turns mixture rows into these keys (ids are per source: "a"'s d1 is not "b"'s d1).
    rows = {"source": ["a", "a", "a", "b"], "query_id": ["q0", "q1", "q2", "q3"], "doc_id": ["d0", "d1", "d2", "d1"],
            "relevant_ids": [["d0", "d2"], ["d1"], ["d0", "d2"], ["d1", "d2"]]}
    keys = ContrastiveCollator(None, train_config([{"name": "a", "kind": "beir", "url": "x"}])).mixture_keys(rows)
    assert torch.equal(not_judged_relevant(keys["relevant_keys"], keys["doc_key"]), expected)


def test_the_pair_stage_tells_documents_of_different_sources_apart(minilm_path):
    from embedlib.encoding.encoder import Encoder

    rows = {"source": ["a", "a", "a", "b"], "query_id": ["q0", "q1", "q2", "q3"], "doc_id": ["d0", "d1", "d1", "d1"],
            "query": ["w", "x", "y", "z"], "positive": ["p0", "p1", "p1", "p1 in b"],
            "relevant_ids": [["d0"], ["d1"], ["d1"], ["d1"]]}
    cfg = train_config([{"name": "a", "kind": "beir", "url": "x"}, {"name": "b", "kind": "beir", "url": "y"}])
    batch = ContrastiveCollator(Encoder.from_pretrained(str(minilm_path), max_length=16), cfg)(rows)
    same = same_document(batch["doc_hash"], batch["doc_hash"])
    assert same[1, 2] and not same[1, 3]  # "a"'s d1 twice is one document; "b"'s d1 is another
    assert torch.equal(batch["doc_hash"], batch["doc_key"])  # one identity for both in-batch masks


def test_binary_straight_through_matches_the_served_codes_and_passes_gradients():
    x = torch.tensor([[0.3, -0.2, 0.0, 1.5, -2.0, 0.01, -0.7, 0.9]], requires_grad=True)
    codes = binary_straight_through(x)
    bits = np.unpackbits(np.asarray(quantize_binary(x.detach())), axis=-1, count=8)
    served = (bits * 2.0 - 1.0).astype(np.float32)  # the index's bits as ±1
    assert torch.equal(codes.detach(), torch.from_numpy(served))
    codes.backward(torch.arange(1.0, 9.0).unsqueeze(0))
    assert torch.equal(x.grad, torch.tensor([[1.0, 2, 3, 0, 0, 6, 7, 8]]))  # straight through where |x| <= 1
    # Inside the objective: the binary term adds its own gradient to the pooled vectors.
    q = torch.randn(8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    d = (q.detach() + 0.3 * torch.randn(8, 16, generator=torch.Generator().manual_seed(2))).requires_grad_()
    grads = []
    for weight in (0.0, 1.0):
        q.grad = None
        matryoshka(lambda a, b: pair_loss(a, b, 0.05), [q, d], [8, None], binary_weight=weight).backward()
        grads.append(q.grad.clone())
    assert grads[1].abs().sum() > 0 and not torch.allclose(grads[0], grads[1])


def tie_aware_accuracy(scores: torch.Tensor) -> float:
    """Top-1 accuracy of row ``i`` retrieving column ``i``, ties broken at random (in expectation)."""
    target = torch.arange(scores.shape[0])
    top = scores >= scores.max(1, keepdim=True).values - 1e-6
    return float((top[target, target].float() / top.sum(1)).mean())


def toy_gap(binary_weight: float, seed: int) -> float:
    """A linear encoder (16 -> 32) with per-dimension offsets (many signs nearly constant), trained 100 steps
    on noisy pairs with the INT8 objective, with or without the binary term; float minus binary top-1
    accuracy on 256 held-out pairs."""
    torch.manual_seed(seed)
    encoder = torch.nn.Linear(16, 32)
    with torch.no_grad():
        encoder.weight.normal_(0, 0.1)
        encoder.bias.copy_(0.4 * torch.randn(32).sign())
    optimizer = torch.optim.Adam(encoder.parameters(), lr=3e-3)
    for _ in range(100):
        z = torch.randn(64, 16)
        q, d = encoder(z + 0.3 * torch.randn_like(z)), encoder(z + 0.3 * torch.randn_like(z))
        loss = matryoshka(lambda a, b: pair_loss(a, b, 0.05, None), [q, d], None, binary_weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        z = torch.randn(256, 16, generator=torch.Generator().manual_seed(9))
        q, d = encoder(z + 0.3 * torch.randn_like(z)), encoder(z + 0.3 * torch.randn_like(z))
        return tie_aware_accuracy(cosine_matrix(q, d)) - tie_aware_accuracy(cosine_matrix(q.sign(), d.sign()))


def test_centred_binary_codes_and_float_queries_rank_by_the_documents_signs():
    rng = np.random.default_rng(0)
    centre = np.full(16, 6.0, np.float32)  # every embedding shares a large offset, as sentence embeddings do
    docs = centre + rng.standard_normal((50, 16)).astype(np.float32)
    codes = quantize_binary(torch.from_numpy(docs), centre)
    assert (quantize_binary(torch.from_numpy(docs)) == 255).all()  # sign(x) alone: every code the same
    np.testing.assert_array_equal(codes, np.packbits(docs > centre, axis=1))
    queries = binary_queries(docs[:5] + 0.1, centre)
    scores = asymmetric_binary_similarity(queries, codes)
    signs_ = np.where(docs > centre, 1.0, -1.0)
    # cosine with the ±1 codes; float32 sums of ±q leave ~1e-8 absolute error, large next to scores near 0
    np.testing.assert_allclose(scores, queries @ signs_.T / 4.0, rtol=1e-5, atol=1e-6)
    assert (np.abs(scores) <= 1 + 1e-6).all() and (scores.argmax(axis=1) == np.arange(5)).all()
    np.testing.assert_array_equal(similarity(queries, codes, "binary"), scores)  # float queries: asymmetric
    assert similarity(codes[:5], codes, "binary").max() == 0  # packed queries: -Hamming, as before


def test_binary_centre_is_for_pair_and_triplet_stages():
    values = {"model": "m", "output": "o", "data": {"url": "rows.parquet"}}
    with pytest.raises(ConfigError, match="^binary_centre_docs: is for the pair and triplet stages"):
        from_dict(TrainConfig, {"stage": "contextual", "binary_centre_docs": 64, **values})
    with pytest.raises(ConfigError, match="^binary_centre_docs: must be >= 0"):
        from_dict(TrainConfig, {"stage": "triplet", "binary_centre_docs": -1, **values})


def test_binary_term_lowers_the_binary_float_gap_on_a_toy_problem():
    # The effect per run is small and noisy (about 0.02 accuracy on this toy): compared over six seeds.
    reductions = [toy_gap(0.0, seed) - toy_gap(1.0, seed) for seed in range(6)]
    assert sum(reductions) / len(reductions) > 0.01, reductions
    assert sum(r > 0 for r in reductions) >= 4, reductions


def test_lerp_endpoints_and_best_weight():
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0])
    assert torch.equal(lerp(a, b, 0.0), a) and torch.equal(lerp(a, b, 1.0), b)
    assert torch.allclose(lerp(a, b, 0.25), torch.tensor([1.5, 3.0]))
    curve = [{"t": 0.0, "mean": 0.5}, {"t": 0.25, "mean": 0.53}, {"t": 0.5, "mean": 0.56},
             {"t": 0.75, "mean": 0.6}, {"t": 1.0, "mean": 0.6}]
    assert best_weight(curve) == 0.75  # the best mean, the smaller weight on a tie
    assert best_weight(curve, keep_gain=0.5) == 0.5  # gains 0.03 / 0.06 / 0.1: the first with >= half of 0.1
    assert best_weight(curve, keep_gain=0.25) == 0.25
    assert best_weight([{**p, "mean": 0.5 - p["t"]} for p in curve], keep_gain=0.5) == 0.0  # nothing gained
    # Guard sets cap the weight where one first falls below its t = 0 score (by more than the tolerance).
    guarded = [{**p, "guard": {"g": g, "h": 0.3}} for p, g in zip(curve, (0.40, 0.41, 0.40, 0.39, 0.41), strict=True)]
    assert best_weight(guarded) == 0.5  # 0.75 falls below 0.40, so 1.0 is out too
    assert best_weight(guarded, keep_gain=0.25) == 0.25  # the keep_gain weight is below the cap
    assert best_weight(guarded, guard_tolerance=0.02) == 0.75


def test_bootstrap_guard_stops_at_a_fall_beyond_the_guard_queries_noise_not_at_a_dip():
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, 400)
    noise = rng.normal(0, 0.2, 400)
    noise -= noise.mean()  # each query moves, the mean does not: -0.004 at t = 0.25 is a dip inside the interval
    per_t = {0.0: base, 0.25: base + noise - 0.004, 0.5: base + noise, 0.75: base - 0.05, 1.0: base - 0.1}
    curve = [{"t": t, "mean": 0.5 + t / 10, "guard": {"g": float(v.mean())},
              "guard_per_query": {"g": {f"q{i}": float(x) for i, x in enumerate(v)}}} for t, v in per_t.items()]
    assert guard_limit(curve) == 0.0  # by score, the first dip stops it
    assert guard_limit(curve, rule="bootstrap") == 0.5  # 0.75's fall of 0.05 is outside the interval
    assert guard_limit(curve, tolerance=0.06, rule="bootstrap") == 0.75  # its interval is not all below -0.06
    assert best_weight(curve, guard_rule="bootstrap") == 0.5
    change, low, high = guard_change(curve[0], curve[3], "g")
    assert change == pytest.approx(-0.05) and low == pytest.approx(-0.05) and high == pytest.approx(-0.05)
    change, low, high = guard_change(curve[0], curve[1], "g")
    assert low < change < high and low < 0 < high
    without_queries = [{key: value for key, value in point.items() if key != "guard_per_query"} for point in curve]
    assert guard_limit(without_queries) == 0.0  # the score rule needs no per-query scores
    with pytest.raises(ValueError, match="guard_per_query"):
        guard_limit(without_queries, rule="bootstrap")


def test_sweep_scores_each_weight_on_the_heldout_queries(tiny_models, shared_data, tmp_path):
    from embedlib.encoding.encoder import Encoder
    from embedlib.training.merge import dev_score

    first = tiny_models["pplx-embed"]
    other = perturbed_copy(first, tmp_path / "other", seed=3)
    beir = write_beir_subset(shared_data / "cranfield", tmp_path / "cranfield", 20, 40)
    dev = heldout_dataset(SourceConfig(name="cran", kind="beir", url=str(beir), split="test", holdout=0.5))
    guard = unseen_dataset(SourceConfig(name="cran", kind="beir", url=str(beir), split="test", holdout=0.5))
    curve = sweep(first, other, [0.0, 0.5, 1.0], {"cran": (dev, False)}, method="linear", max_length=32,
                  guard_sets={"unseen": (guard, False)})
    assert [p["t"] for p in curve] == [0.0, 0.5, 1.0]
    for point, model in ((curve[0], first), (curve[2], other)):
        encoder = Encoder.from_pretrained(model, device="cpu", max_length=32)
        assert point["scores"]["cran"] == pytest.approx(dev_score(encoder, "x", dev, False, "int8", None))
        assert point["guard"]["unseen"] == pytest.approx(dev_score(encoder, "y", guard, False, "int8", None))
        assert "unseen" not in point["scores"]  # guard sets never enter the dev mean the rule maximises


def test_merge_job_sweeps_with_guard_sets_and_merges_at_the_chosen_weight(tiny_models, shared_data, tmp_path,
                                                                          merge_job, capsys):
    import json

    from embedlib.training.recipe import read_recipe

    first = tiny_models["pplx-embed"]
    perturbed_copy(first, tmp_path / "second", seed=5)
    beir = write_beir_subset(shared_data / "cranfield", tmp_path / "cranfield", 20, 40)
    source = f"kind: beir, url: {beir}, split: test, holdout: 0.5"
    for name, tolerance, rule in (("strict", 0.0, "score"), ("loose", 10.0, "score"), ("noise", 0.0, "bootstrap")):
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"first: {first}\nsecond: {tmp_path / 'second'}\noutput: {tmp_path / name}\n"
                          f"method: linear\nmax_length: 32\nsweep: [0.0, 0.5, 1.0]\ndev: [{{name: cran, {source}}}]\n"
                          f"guard: [{{name: unseen, {source}}}]\nguard_tolerance: {tolerance}\nguard_rule: {rule}\n")
        assert merge_job.main(["--config", str(config)]) == 0
        report = json.loads((tmp_path / name / "merge_sweep.json").read_text())
        assert all(set(point["guard"]) == {"unseen"} for point in report["curve"])
        assert report["dev_queries"]["cran"] + report["dev_queries"]["unseen"] == 20  # the split and the rest
        for point in report["curve"]:  # every guard query's score, and the interval of their mean change
            scores = point["guard_per_query"]["unseen"]
            assert len(scores) == report["dev_queries"]["unseen"]
            assert point["guard"]["unseen"] == pytest.approx(sum(scores.values()) / len(scores))
            change = point["guard_change"]["unseen"]
            assert change["low"] <= change["change"] <= change["high"]
            assert change["change"] == pytest.approx(point["guard"]["unseen"] - report["curve"][0]["guard"]["unseen"])
        assert report["guard_rule"] == rule
        assert report["guard_limit"] == guard_limit(report["curve"], tolerance, rule)
        assert report["chosen_t"] <= report["guard_limit"]
        assert read_recipe(tmp_path / name)["config"]["t"] == report["chosen_t"]
        assert (tmp_path / name / "merge_sweep.png").stat().st_size > 0
        if name == "loose":
            assert report["guard_limit"] == 1.0  # a tolerance no score can fall through never caps the weight
    assert "unseen" in capsys.readouterr().out


WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]


def train_steps(parts, batch: dict, steps: int, lr: float) -> list[dict]:
    """``steps`` AdamW steps of ``parts.module`` on one batch; each step's outputs."""
    trainable = [p for p in parts.module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    outs = []
    for _ in range(steps):
        out = parts.module(batch)
        out["loss"].backward()
        optimizer.step()
        optimizer.zero_grad()
        outs.append(out)
    return outs


def drift_after_training(model: str, anchor_weight: float, steps: int = 6) -> float:
    """Mean ``1 - cos`` between the starting and the trained model's embeddings of the training texts."""
    from embedlib.training.stages import build_stage

    cfg = from_dict(TrainConfig, {
        "stage": "pair", "model": model, "output": "unused", "batch_size": 8, "anchor_weight": anchor_weight,
        "data": {"url": "unused", "max_length": 16, "query_max_length": 16}, "optimizer": {"lr": 1e-3},
    })
    torch.manual_seed(0)
    parts = build_stage(cfg, seed=0)
    rows = {"query": [f"{w} query" for w in WORDS], "positive": [f"the {w} document" for w in WORDS],
            "doc_id": WORDS}
    batch = parts.collate(rows)
    parts.module.eval()
    start = parts.module.embed(batch["positive"]).detach()
    parts.module.train()
    out = train_steps(parts, batch, steps, cfg.optimizer.lr)[-1]
    if anchor_weight:
        assert parts.module.anchor.training is False  # train() leaves the reference without dropout
        assert not any(p.requires_grad for p in parts.module.anchor.parameters())
        assert float(out["anchor_loss"]) > 0
    parts.module.eval()
    return float((1 - cosine(parts.module.embed(batch["positive"]).detach(), start)).mean())


def test_anchor_guard_keeps_the_embeddings_near_the_starting_model(tiny_models):
    model = str(tiny_models["pplx-embed"])
    free, anchored = drift_after_training(model, 0.0), drift_after_training(model, 50.0)
    assert anchored < 0.5 * free, (anchored, free)


def test_anchor_only_batches_pull_a_drifted_model_back_to_the_starting_model(tiny_models):
    from embedlib.training.stages import build_stage

    cfg = from_dict(TrainConfig, {
        "stage": "triplet", "model": str(tiny_models["pplx-embed"]), "output": "unused", "batch_size": 8,
        "anchor_weight": 10.0, "hard_negatives": 1, "optimizer": {"lr": 1e-3},
        "data": {"url": "unused", "max_length": 16, "query_max_length": 16},
    })
    torch.manual_seed(0)
    parts = build_stage(cfg, seed=0)
    rows = {"query": [f"{w} query" for w in WORDS], "positive": [f"the {w} document" for w in WORDS],
            "anchor_only": [True] * 8}
    batch = parts.collate(rows)
    assert batch["anchor_only"] is True and "negatives" not in batch  # no triplet negatives read or encoded
    with pytest.raises(ValueError, match="mixes anchor-only rows with training rows"):
        parts.collate({**rows, "anchor_only": [True] * 7 + [False]})
    with torch.no_grad():
        for param in parts.module.backbone.parameters():
            param.add_(0.05 * torch.randn_like(param))
    outs = train_steps(parts, batch, 8, cfg.optimizer.lr)
    for out in outs:
        assert torch.allclose(out["loss"], cfg.anchor_weight * out["anchor_loss"])  # the anchor term alone
    drift = [float(out["anchor_loss"]) for out in outs]
    assert drift[0] > 0.01 and drift[-1] < 0.5 * drift[0], drift


def test_anchor_guard_is_for_pair_and_triplet_stages():
    with pytest.raises(ConfigError, match="^anchor_weight: applies to the pair and triplet"):
        from_dict(TrainConfig, {"stage": "contextual", "model": "m", "output": "o", "anchor_weight": 1.0,
                                "data": {"url": "rows.parquet"}})
