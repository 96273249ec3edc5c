"""DiffRetriever through the system's jobs: the Ray Data indexing pipeline and the evaluation run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import cranfield_rows, write_beir_subset, write_jsonl

from embedlib.data import SAMPLE_DATASET
from embedlib.encoding.formats import embedded_text
from embedlib.encoding.representative_tokens import DiffRetrieverEncoder, RepresentativeTokens
from embedlib.index import ConfigError, IndexJobConfig, ShardedIndex, build_index
from embedlib.models.tiny_diffusion import make_tiny_diffusion_qwen3_checkpoint
from embedlib.search.hybrid import MODES, exhaustive_scores
from embedlib.search.multivector import STORED_DTYPE
from embedlib.search.sparse import DEFAULT_SCALE, quantize_weights

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def diffusion_model(tmp_path_factory) -> Path:
    return make_tiny_diffusion_qwen3_checkpoint(tmp_path_factory.mktemp("dr") / "tiny-diffusion-qwen3")


def sample_queries(n: int) -> list[str]:
    with open(SAMPLE_DATASET / "queries.jsonl") as f:
        return [json.loads(line)["text"] for line in f][:n]


def as_indexed(docs: RepresentativeTokens) -> RepresentativeTokens:
    """The documents as the index stores them: vectors in float16, sparse weights quantized to integers."""
    sparse = quantize_weights(docs.sparse, DEFAULT_SCALE).astype(np.float32) / DEFAULT_SCALE
    dense = [d.astype(STORED_DTYPE).astype(np.float32) for d in docs.dense]
    return RepresentativeTokens(dense=dense, sparse=sparse, k=docs.k)


def test_pipeline_index_searches_like_exhaustive_scoring_in_every_mode(ray_cluster, tmp_path, diffusion_model):
    rows = cranfield_rows(40)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", rows)
    output = str(tmp_path / "index")
    cfg = IndexJobConfig(input=corpus, output=output, model=str(diffusion_model), method="diffretriever",
                         k_passage=4, k_query=2, shard_size=15, batch_rows=20, show_progress=False)
    summary = build_index(cfg)
    assert (summary.docs_in, summary.embedded, summary.shards) == (40, 40, 3)

    index = ShardedIndex.open(output)
    assert index.manifest["method"] == "diffretriever" and index.manifest["k_passage"] == 4
    encoder = DiffRetrieverEncoder.from_pretrained(diffusion_model, device="cpu")
    docs = as_indexed(encoder.encode([embedded_text(r["title"], r["text"]) for r in rows], k=4))
    queries = sample_queries(8)
    tokens = encoder.encode(queries, k=2, kind="query")
    ids = [r["_id"] for r in rows]
    for mode in MODES:
        found = index.search_representative(queries, k=10, mode=mode, candidates=40)
        scores, hits = found.scores, found.ids
        exact = exhaustive_scores(tokens, docs, mode)
        expected = -np.sort(-exact, axis=1)[:, :10]
        np.testing.assert_allclose(scores, expected, atol=2e-4, err_msg=mode)
        for row, found in enumerate(hits):  # each hit's own exact score is the score returned for it
            np.testing.assert_allclose([exact[row, ids.index(h)] for h in found], scores[row], atol=2e-4)

    default_scores = index.search(queries, k=5).scores  # hybrid with the manifest's k_query
    hybrid_scores = index.search_representative(queries, k=5, mode="hybrid").scores
    np.testing.assert_allclose(default_scores, hybrid_scores)
    with pytest.raises(ValueError, match="nprobe"):  # an IVF option is refused, not silently ignored
        index.search(queries, k=5, nprobe=4)
    remote = ShardedIndex.open(output, use_ray=True)
    assert (
        remote.search_representative(queries, k=5, mode="sparse").ids
        == index.search_representative(queries, k=5, mode="sparse").ids
    )

    again = build_index(cfg)  # nothing changed: every document's vectors are carried over
    assert (again.embedded, again.carried_over) == (0, 40)


def test_diffretriever_config_refuses_dense_only_fields():
    base = dict(input="in.jsonl", output="out", method="diffretriever")
    with pytest.raises(ConfigError, match="chunk_tokens"):
        IndexJobConfig(**base, chunk_tokens=64).validate()
    with pytest.raises(ConfigError, match="quantization"):
        IndexJobConfig(**base, quantization="binary").validate()
    with pytest.raises(ConfigError, match="method"):
        IndexJobConfig(input="in.jsonl", output="out", method="colbert").validate()
    with pytest.raises(ConfigError, match="k_passage"):
        IndexJobConfig(**base, k_passage=0).validate()


def run_job(name: str, argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "jobs"))
    module = __import__(name)
    return module.main(argv)


def test_index_and_evaluate_jobs_run_diffretriever_side_by_side(
    ray_cluster, shared_data, diffusion_model, tmp_path, capsys
):
    dataset = write_beir_subset(shared_data / "cranfield", tmp_path / "cranfield", 8, 20)
    index_url = str(tmp_path / "index")
    assert run_job("index", ["--input", str(dataset / "corpus.jsonl"), "--output", index_url, "--model",
                             str(diffusion_model), "--method", "diffretriever", "--k-passage", "4", "--k-query",
                             "2", "--no-progress"]) == 0
    out = tmp_path / "report"
    assert run_job("evaluate", ["--dataset", str(dataset), "--method", "diffretriever", "--model",
                                f"tiny={diffusion_model}", "--k-query", "1,2", "--k-passage", "4", "--bm25",
                                "--index", index_url, "--out", str(out), "--no-progress"]) == 0
    systems = json.loads((out / "metrics.json").read_text())["systems"]
    expected = {f"tiny/Kq={k}/{mode}" for k in (1, 2) for mode in MODES} | {"bm25", "index:index/diffretriever"}
    assert set(systems) == expected
    assert systems["tiny/Kq=2/dense"]["storage"]["bytes_per_doc"] > 4 * 64 * 4  # K_p float16 vectors twice (rerank copy, FAISS) and the sparse vector
    # The published index (K_q=2 from its manifest, hybrid, candidates covering every shard) ranks like the
    # in-process system with the same settings.
    for key in ("ndcg@10", "recall@100"):
        assert systems["index:index/diffretriever"]["metrics"][key] == pytest.approx(
            systems["tiny/Kq=2/hybrid"]["metrics"][key], abs=1e-6
        )
