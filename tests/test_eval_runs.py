"""Evaluation runs on real data (a Cranfield subset, Quora questions, Tatoeba lines) with MiniLM, a tiny random
model and BM25; reports on real S3; published ShardedIndex evaluated in place; bad input."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import centred_model, write_beir_subset

from embedlib import storage
from embedlib.config import ConfigError
from embedlib.eval.beir import DatasetError, load_beir
from embedlib.eval.job import EvalConfig, run_evaluation
from embedlib.eval.run import corpus_part, evaluate_systems, retrieve
from embedlib.eval.systems import BM25System, DenseSystem, ModelEmbeddings

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cranfield(shared_data, tmp_path_factory) -> Path:
    return write_beir_subset(shared_data / "cranfield", tmp_path_factory.mktemp("cranfield"), 10, 40)


@pytest.fixture(scope="module")
def side_by_side(cranfield, minilm_path, tiny_models, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("report")
    config = EvalConfig(out=str(out), dataset=str(cranfield), bm25=True, ann=True, max_length=48,
                        models=[f"minilm={minilm_path}", f"tiny={tiny_models['pplx-embed']}"], show_progress=False)
    return {"document": run_evaluation(config), "out": out}


def ndcg(document: dict, system: str) -> float:
    return document["systems"][system]["metrics"]["ndcg@10"]


def test_trained_model_and_bm25_beat_a_random_model(side_by_side):
    document = side_by_side["document"]
    for quantization in ("float", "int8", "binary"):
        assert ndcg(document, f"minilm/{quantization}") > ndcg(document, f"tiny/{quantization}")
    assert ndcg(document, "bm25") > ndcg(document, "tiny/float")


def test_storage_per_system_follows_the_quantization(side_by_side):
    systems = side_by_side["document"]["systems"]
    bytes_per_doc = {q: systems[f"minilm/{q}"]["storage"]["bytes_per_doc"] for q in ("float", "int8", "binary")}
    assert bytes_per_doc == {"float": 4 * 384, "int8": 384, "binary": 384 / 8}
    assert systems["minilm/binary"]["storage"]["docs_per_mb"] == pytest.approx(1e6 / 48)
    assert systems["minilm/float/hnsw"]["storage"]["bytes_per_doc"] > bytes_per_doc["float"]
    assert systems["bm25"]["storage"]["bytes_per_doc"] > 0


def test_ann_systems_report_recall_against_their_exact_twin(side_by_side):
    systems = side_by_side["document"]["systems"]
    for quantization in ("float", "int8", "binary"):
        ann = systems[f"minilm/{quantization}/hnsw"]["ann_recall_vs_exact"]
        assert ann["exact_system"] == f"minilm/{quantization}"
        assert 0.0 <= ann["@10"] <= 1.0 and 0.0 <= ann["@100"] <= 1.0
    assert systems["minilm/float"]["ann_recall_vs_exact"] is None


def test_report_files_exist_and_parse(side_by_side, cranfield):
    out = side_by_side["out"]
    document = json.loads((out / "metrics.json").read_text())
    assert document["format"] == "embedlib-eval/1"
    assert document["dataset"]["queries"] == 10 and document["dataset"]["mode"] == "q2d"
    per_query = json.loads((out / "per_query.json").read_text())
    judged = set(load_beir(str(cranfield)).judged_queries())
    assert set(per_query["minilm/float"]) == judged
    report = (out / "report.md").read_text()
    for name in document["systems"]:
        assert f"| {name} |" in report
    assert (out / "recall_at_k.png").read_bytes().startswith(PNG_MAGIC)


def test_q2q_never_retrieves_the_query_itself(shared_data, minilm_path, tmp_path):
    quora = write_beir_subset(shared_data / "quora-q2q", tmp_path / "quora", 10, 60)
    dataset = load_beir(str(quora))
    queries = dataset.judged_queries()
    model = ModelEmbeddings.load("minilm", str(minilm_path), max_length=32, show_progress=False)
    dense, bm25 = DenseSystem(model, "float"), BM25System(show_progress=False)
    results = {r.name: r for r in evaluate_systems(dataset, [dense, bm25], q2q=True, max_k=10)}
    for system in (dense, bm25):
        run = retrieve(system, queries, 10, ignore_identical_ids=True)
        assert all(qid not in hits and len(hits) == 10 for qid, hits in run.items())
    # Without the rule a query's own text is its best match: exact cosine search ranks it first.
    raw = dense.search(list(queries.values()), 11).ids
    assert [hits[0] for hits in raw] == list(queries)
    assert results["minilm/float"].metrics["recall@10"] > 0


def test_recall_never_rises_as_distractors_are_added(cranfield, tiny_models, shared_data, tmp_path):
    config = EvalConfig(out=str(tmp_path), dataset=str(cranfield), models=[f"tiny={tiny_models['pplx-embed']}"],
                        quantizations=["float", "binary"], distractors=str(shared_data / "text"),
                        scales=[1, 2, 4], max_length=48, show_progress=False)
    document = run_evaluation(config)
    points = document["scale"]["points"]
    corpus = document["dataset"]["documents"]
    assert [p["documents"] for p in points["tiny/float"]] == [corpus, 2 * corpus, 4 * corpus]
    for name in ("tiny/float", "tiny/binary"):  # exact search: extra documents can only push hits down
        for key in ("recall@10", "recall@100", "recall@1000"):
            values = [p[key] for p in points[name]]
            assert values == sorted(values, reverse=True), (name, key, values)
    assert points["tiny/float"][0]["recall@10"] == document["systems"]["tiny/float"]["metrics"]["recall@10"]
    assert (tmp_path / "recall_vs_corpus_size.png").read_bytes().startswith(PNG_MAGIC)


def test_growth_through_the_indexing_pipeline_embeds_only_new_docs_and_matches_in_process(
    cranfield, tiny_models, shared_data, ray_cluster, tmp_path
):
    common = dict(dataset=str(cranfield), models=[f"tiny={tiny_models['pplx-embed']}"], quantizations=["int8"],
                  distractors=str(shared_data / "text"), scales=[1, 2], show_progress=False)
    in_process = run_evaluation(EvalConfig(out=str(tmp_path / "a"), **common))["scale"]["points"]["tiny/int8"]
    document = run_evaluation(EvalConfig(out=str(tmp_path / "b"), scale_index=str(tmp_path / "grow"), **common))
    piped = document["scale"]["points"]["tiny/int8"]
    corpus = document["dataset"]["documents"]
    assert [(p["embedded"], p["index_version"]) for p in piped] == [(corpus, 1), (corpus, 2)]
    for key in ("recall@10", "recall@100", "recall@1000"):  # flat int8 index = exact int8 cosine search
        assert [p[key] for p in piped] == pytest.approx([p[key] for p in in_process])


def test_bitext_accuracy_both_directions(shared_data, minilm_path, tiny_models, tmp_path):
    for suffix in ("fra", "eng"):
        lines = (shared_data / "tatoeba" / f"tatoeba.fra-eng.{suffix}").read_text().splitlines()[:25]
        (tmp_path / f"tatoeba.fra-eng.{suffix}").write_text("\n".join(lines) + "\n")
    config = EvalConfig(out=str(tmp_path / "out"), bitext=str(tmp_path), quantizations=["float"], max_length=32,
                        models=[f"minilm={minilm_path}", f"tiny={tiny_models['pplx-embed']}"], show_progress=False)
    bitext = run_evaluation(config)["bitext"]
    for direction in ("fra_to_eng", "eng_to_fra"):
        assert bitext["minilm/float"]["fra"][direction] > bitext["tiny/float"]["fra"][direction]
    assert "Bitext mining" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("centred", [False, True], ids=["sign", "centred"])
def test_published_index_is_evaluated_in_place_like_exact_search(cranfield, tiny_models, ray_cluster, tmp_path,
                                                                 centred):
    from embedlib.index import IndexJobConfig, build_index

    model = str(tiny_models["pplx-embed"])
    if centred:  # binary codes sign(x - c), float queries: the published index and the in-process system agree
        texts = load_beir(str(cranfield), "test").doc_texts()
        model = str(centred_model(tiny_models["pplx-embed"], tmp_path / "centred", texts))
    index_url = str(tmp_path / "index")
    build_index(IndexJobConfig(input=str(cranfield / "corpus.jsonl"), output=index_url, model=model,
                               quantization="binary", index_type="flat", show_progress=False))
    config = EvalConfig(out=str(tmp_path / "out"), dataset=str(cranfield), models=[f"tiny={model}"],
                        quantizations=["binary"], indexes=[index_url], show_progress=False)
    systems = run_evaluation(config)["systems"]
    published = next(name for name in systems if name.startswith("index:"))
    assert systems[published]["description"]["kind"] == "index"
    assert systems[published]["description"]["index_type"] == "flat"  # read from the manifest, not null
    assert systems[published]["unknown_retrieved_ids"] == 0
    assert systems[published]["storage"]["bytes_per_doc"] > 0
    # Hamming ties may be broken in another order at 10; the centred path's float scores have none
    for key in ("recall@10", "recall@100", "recall@1000") if centred else ("recall@100", "recall@1000"):
        assert systems[published]["metrics"][key] == pytest.approx(systems["tiny/binary"]["metrics"][key])


def run_cli(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "jobs"))
    import evaluate

    return evaluate.main(argv)


def test_report_goes_to_s3_through_the_cli(cranfield, tiny_models, s3_bucket, capsys):
    out = f"{s3_bucket}/nightly/report"
    status = run_cli(["--dataset", str(cranfield), "--bm25", "--model", f"tiny={tiny_models['pplx-embed']}",
                      "--quantization", "int8", "--max-length", "48", "--out", out, "--no-progress"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "| bm25 |" in captured.out
    document = json.loads(storage.read_bytes(storage.join(out, "metrics.json")))
    assert set(document["systems"]) == {"tiny/int8", "bm25"}
    assert storage.read_bytes(storage.join(out, "recall_at_k.png")).startswith(PNG_MAGIC)
    assert "secret" not in json.dumps(document).lower()


# --- bad input -----------------------------------------------------------------------------------------------


def copy_dataset(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_missing_qrels_names_the_file(cranfield, tmp_path, capsys):
    broken = copy_dataset(cranfield, tmp_path / "broken")
    (broken / "qrels" / "test.tsv").unlink()
    with pytest.raises(DatasetError, match=r"qrels/test\.tsv: file not found"):
        load_beir(str(broken))
    status = run_cli(["--dataset", str(broken), "--bm25", "--out", str(tmp_path / "out"), "--no-progress"])
    assert status == 2
    assert "qrels/test.tsv" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unknown_ids_in_qrels_are_counted_and_named(cranfield, tmp_path):
    broken = copy_dataset(cranfield, tmp_path / "broken")
    with open(broken / "qrels" / "test.tsv", "a") as f:
        f.write("no-such-query\t1\t1\n1\tno-such-doc\t1\n1\tnor-this-doc\t1\n")
    with pytest.raises(DatasetError) as error:
        load_beir(str(broken))
    message = str(error.value)
    assert "qrels/test.tsv" in message
    assert "1 unknown query ids ['no-such-query']" in message
    assert "2 unknown corpus ids ['no-such-doc', 'nor-this-doc']" in message


def test_empty_query_set_is_an_error(cranfield, tmp_path):
    broken = copy_dataset(cranfield, tmp_path / "broken")
    (broken / "queries.jsonl").write_text("")
    (broken / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(DatasetError, match=r"queries\.jsonl: no queries"):
        load_beir(str(broken))


def test_parquet_layout_loads_like_jsonl(cranfield, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    reference = load_beir(str(cranfield))
    target = tmp_path / "parquet"
    (target / "qrels").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"_id": d, **doc} for d, doc in reference.corpus.items()]),
                   target / "corpus.parquet")
    pq.write_table(pa.Table.from_pylist([{"_id": q, "text": t} for q, t in reference.queries.items()]),
                   target / "queries.parquet")
    rows = [{"query-id": q, "corpus-id": d, "score": r} for q, docs in reference.qrels.items() for d, r in docs.items()]
    pq.write_table(pa.Table.from_pylist(rows), target / "qrels" / "test.parquet")
    loaded = load_beir(str(target))
    assert (loaded.corpus, loaded.queries, loaded.qrels) == (reference.corpus, reference.queries, reference.qrels)


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="models"):
        EvalConfig(out=str(tmp_path), dataset="x").validate()
    with pytest.raises(ConfigError, match="distractors"):
        EvalConfig(out=str(tmp_path), dataset="x", bm25=True, scales=[1, 10]).validate()
    with pytest.raises(ConfigError, match="quantizations"):
        EvalConfig(out=str(tmp_path), dataset="x", bm25=True, quantizations=["int4"]).validate()
    with pytest.raises(ConfigError, match="datasett: unknown field"):
        EvalConfig.from_dict({"out": "x", "datasett": "y"})
    with pytest.raises(ConfigError, match="k_passage: must be int"):
        EvalConfig.from_dict({"out": "x", "dataset": "y", "bm25": True, "k_passage": "16"})


def test_systems_sharing_a_model_do_not_change_each_others_results(cranfield, tiny_models):
    """The float system normalises its vectors for FAISS; that must not reach the int8 system's codes."""
    dataset = load_beir(str(cranfield), "test")
    queries = dataset.judged_queries()

    def int8_run(float_first: bool) -> dict:
        model = ModelEmbeddings.load("tiny", str(tiny_models["pplx-embed"]), max_length=48, show_progress=False)
        if float_first:
            float_system = DenseSystem(model, "float")
            float_system.build([corpus_part(dataset)])
            retrieve(float_system, queries, 10, False)
        int8_system = DenseSystem(model, "int8")
        int8_system.build([corpus_part(dataset)])
        return retrieve(int8_system, queries, 20, False)

    assert int8_run(float_first=True) == int8_run(float_first=False)
