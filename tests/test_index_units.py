"""Pure pieces of the indexing stage: row checks, config validation, chunk spans, top-k merging, FAISS scoring."""

from __future__ import annotations

import numpy as np
import pytest

from embedlib.encoding.encoder import chunk_spans
from embedlib.encoding.formats import cosine_similarity
from embedlib.index.config import ConfigError, IndexJobConfig
from embedlib.index.faiss_shards import (
    default_params,
    deserialize,
    search_shard,
    shard_index,
    trained_template,
    unit_scale,
)
from embedlib.index.manifest import encoding_key
from embedlib.index.reading import check_row
from embedlib.search.results import SearchResult, merge_results
from embedlib.storage import redact_url


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (("a", "t", "text"), ""),
        ((7, None, "text"), ""),
        ((None, "t", "text"), "missing id"),
        (("", "t", "text"), "missing id"),
        (("a", "t", None), "null text"),
        (("a", "t", 3.5), "non-string text"),
        (("a", "t", b"\xff\xfe"), "undecodable bytes"),
        (("a", "t", "x" * 11), "text over 10 chars"),
    ],
)
def test_check_row_reasons(row, reason):
    assert check_row(*row, max_chars=10)[3] == reason


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="index_type"):
        IndexJobConfig(input="a", output="b", index_type="lsh").validate()
    with pytest.raises(ConfigError, match="dim"):
        IndexJobConfig(input="a", output="b", quantization="binary", dim=12).validate()
    with pytest.raises(ConfigError, match="shrad_size"):
        IndexJobConfig.from_dict({"input": "a", "output": "b", "shrad_size": 3})


def test_chunk_spans_cover_content_tokens_only():
    offsets = np.array([[0, 0], [0, 3], [4, 7], [8, 9], [10, 14], [0, 0]])  # CLS, 4 tokens, SEP
    spans = chunk_spans(offsets, 3)
    assert [list(p) for p, _, _ in spans] == [[1, 2, 3], [4]]
    assert [(s, e) for _, s, e in spans] == [(0, 9), (10, 14)]
    assert [(s, e) for _, s, e in chunk_spans(np.array([[0, 0], [0, 0]]), 3)] == [(0, 0)]


def test_merge_keeps_best_k_and_pads():
    shard_a = SearchResult(scores=np.array([[0.9, 0.1]], np.float32), ids=[["a1", "a2"]])
    shard_b = SearchResult(scores=np.array([[0.5, -np.inf]], np.float32), ids=[["b1", None]])
    merged = merge_results([shard_a, shard_b], n=1, k=4)
    assert merged.ids == [["a1", "b1", "a2", None]]
    assert np.isneginf(merged.scores[0, 3]) and list(merged.scores[0, :3]) == pytest.approx([0.9, 0.5, 0.1])


def test_int8_flat_shard_is_exact_cosine_and_ivf_close():
    rng = np.random.default_rng(0)
    vectors = np.clip(rng.normal(0, 40, (2000, 32)) * rng.uniform(0.2, 1.5, (2000, 1)), -127, 127).astype(
        np.int8
    )
    queries = np.clip(rng.normal(0, 40, (10, 32)), -127, 127).astype(np.int8)
    exact = np.argsort(-cosine_similarity(queries, vectors), axis=1, kind="stable")[:, :5]
    params = {"unit_scale": unit_scale(vectors), "nlist": 8, "nprobe": 8, "rerank_factor": 4}
    for index_type in ("flat", "ivf", "hnsw"):
        template = trained_template("int8", index_type, 32, params | {"hnsw_m": 16, "ef_search": 64}, vectors)
        index = deserialize(shard_index(template, vectors, "int8", params), "int8")
        positions = search_shard(index, vectors, queries, 5, "int8", index_type, params | {"ef_search": 64}).positions
        agreement = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(positions, exact, strict=True)])
        assert agreement == 1.0 if index_type != "hnsw" else agreement >= 0.9


def test_encoding_key_and_redaction():
    assert encoding_key("w", "int8", None, None, 512) != encoding_key("w", "binary", None, None, 512)
    assert encoding_key("w", "int8", None, None, 512) == encoding_key("w", "int8", None, None, 512)
    assert redact_url("s3://user:secret@bucket/x") == "s3://bucket/x"
    assert redact_url("/local/path") == "/local/path"


def test_ivf_pq_trains_on_a_small_corpus():
    vectors = np.random.default_rng(0).normal(size=(160, 32)).astype(np.float32)
    cfg = IndexJobConfig(input="a", output="b", nlist=400)
    params = default_params("ivf", "float", 32, vectors, len(vectors), cfg)
    assert params["nlist"] <= 160 and 2 ** params["pq_nbits"] <= 160
    index = deserialize(
        shard_index(trained_template("float", "ivf", 32, params, vectors), vectors, "float", params), "float"
    )
    positions = search_shard(index, vectors, vectors[:10], 3, "float", "ivf", params).positions
    assert list(positions[:, 0]) == list(range(10))
