"""Indexing end to end on real Ray, real FAISS and a real S3 endpoint (moto server over HTTP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (
    all_ids,
    centred_model,
    cranfield_rows,
    index_config,
    jsonl_bytes,
    shard_tables,
    write_jsonl,
)

from embedlib import storage
from embedlib.data import SAMPLE_DATASET
from embedlib.encoding.encoder import Encoder
from embedlib.encoding.formats import (
    asymmetric_binary_similarity,
    binary_queries,
    cosine_similarity,
    embedded_text,
)
from embedlib.index import (
    ConfigError,
    IndexJobConfig,
    IndexMismatchError,
    InputError,
    ShardedIndex,
    StorageLostDataError,
    build_index,
)
from embedlib.index.build import assemble_version, configure_ray_data, encode
from embedlib.index.columns import column_matrix
from embedlib.index.plan import check_locations, plan

ROOT = Path(__file__).resolve().parents[1]


config = partial(index_config, batch_rows=256)


@pytest.fixture(scope="module")
def model(tiny_models) -> Path:
    return tiny_models["pplx-embed"]


def staged_run(cfg: IndexJobConfig):
    """The first two steps of a build (plan, encode), as a job killed before assembling leaves them."""
    configure_ray_data(cfg)
    run = plan(cfg, check_locations(cfg))
    totals, _ = encode(run)
    return run, totals


def part_files(run) -> list[str]:
    fs, path = storage.filesystem(run.parts)
    return sorted(p for p in fs.ls(path, detail=False) if p.endswith(".parquet")) if fs.exists(path) else []


def test_s3_corpus_to_s3_index_every_id_once_and_no_credentials(ray_cluster, s3_bucket, model):
    """On S3: lost staging parts fail loudly, the rerun resumes from the parts that are left, every id once."""
    rows = cranfield_rows(250)
    storage.write_bytes_atomic(f"{s3_bucket}/corpus/part-0.jsonl", jsonl_bytes(rows[:120]))
    storage.write_bytes_atomic(f"{s3_bucket}/corpus/part-1.jsonl", jsonl_bytes(rows[120:]))
    output = f"{s3_bucket}/index"
    cfg = config(f"{s3_bucket}/corpus", output, model, batch_rows=64)
    run, totals = staged_run(cfg)
    parts = part_files(run)
    assert len(parts) >= 2 and totals["docs"] == 250
    fs, _ = storage.filesystem(run.parts)
    with fs.open(parts[0], "rb") as f:
        lost = pq.ParquetFile(f).metadata.num_rows
    fs.rm(parts[0])  # storage loses a part between the steps (an object store restarted empty, say)
    with pytest.raises(StorageLostDataError, match=rf"index/_staging/.*wrote 250 valid documents there, but {250 - lost}"):
        assemble_version(run, totals)
    assert not storage.exists(f"{output}/manifest.json")

    summary = build_index(cfg)  # finds the remaining parts on S3 and encodes only the lost rows
    assert (summary.docs_in, summary.rejected, summary.shards) == (250, 0, 3)
    assert (summary.embedded, summary.carried_over) == (lost, 250 - lost)
    assert not part_files(run)
    ids = all_ids(output)
    assert sorted(ids) == sorted(r["_id"] for r in rows)
    index = ShardedIndex.open(output)
    found = index.search([rows[7]["title"] + " " + rows[7]["text"]], k=5)
    assert found.ids[0][0] == rows[7]["_id"] and found.scores.shape == (1, 5) and found.scores.dtype == np.float32
    assert np.all(np.diff(found.scores[0]) <= 0)

    secrets = (os.environ["AWS_SECRET_ACCESS_KEY"], os.environ["AWS_ACCESS_KEY_ID"])
    fs, path = storage.filesystem(output)
    for file in fs.find(path):
        if file.endswith((".json", ".jsonl")):
            text = fs.cat_file(file).decode()
            assert not any(s in text for s in secrets), file
    assert not any(s in str(summary) for s in secrets)


def test_sharded_flat_search_equals_exact_search(ray_cluster, tmp_path, model):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", cranfield_rows(240))
    output = str(tmp_path / "index")
    build_index(config(corpus, output, model, shard_size=50))
    sharded = ShardedIndex.open(output)
    assert len(sharded.manifest["shards"]) == 5
    assert not list((tmp_path / "index").rglob("*.faiss"))  # flat int8 shards are scanned: no FAISS file
    queries = [q["text"] for q in map(json.loads, open(SAMPLE_DATASET / "queries.jsonl"))][:20]
    found = sharded.search(queries, k=10)

    # Exact cosine of every shard's int8 vectors, computed directly: the index returns exactly that ranking.
    table = pa.concat_tables(shard_tables(output))
    vectors = column_matrix(table.column("vector"), np.int8)
    exact = cosine_similarity(sharded.encode_queries(queries), vectors)
    expected = np.argsort(-exact, axis=1, kind="stable")[:, :10]
    doc_ids = table.column("id").to_pylist()
    assert found.ids == [[doc_ids[i] for i in row] for row in expected]
    np.testing.assert_allclose(found.scores, np.take_along_axis(exact, expected, axis=1), rtol=1e-5)

    remote = ShardedIndex.open(output, use_ray=True)  # shards served by Ray actors answer the same
    assert remote.search(queries, k=10).ids == found.ids


def test_incremental_run_reencodes_only_changed_docs(ray_cluster, tmp_path, model):
    rows = cranfield_rows(200)
    output = str(tmp_path / "index")
    first = build_index(config(write_jsonl(tmp_path / "v1.jsonl", rows), output, model))
    assert (first.version, first.embedded, first.carried_over) == (1, 200, 0)

    changed = [dict(r, text=r["text"] + " revised") for r in rows[:5]]
    added = [{"_id": f"new-{i}", "title": "", "text": f"a new document number {i}"} for i in range(7)]
    second_rows = changed + rows[5:190] + added  # rows[190:] deleted
    second = build_index(config(write_jsonl(tmp_path / "v2.jsonl", second_rows), output, model))
    assert (second.version, second.embedded, second.carried_over) == (2, 12, 185)
    assert second.truncated <= second.embedded  # counted over this run's encoded texts only
    assert sorted(all_ids(output)) == sorted(r["_id"] for r in second_rows)

    old = ShardedIndex.open(tmp_path / "index" / "v000001")
    assert old.manifest["version"] == 1 and len(old) == 200  # older version still readable
    assert ShardedIndex.open(output).manifest["version"] == 2

    # A nightly rerun over the same files, model and settings publishes nothing (retention is not used up).
    again = build_index(config(str(tmp_path / "v2.jsonl"), output, model, actors=1, batch_rows=64))
    assert (again.published, again.version, again.embedded, again.carried_over) == (False, 2, 0, 197)
    assert "unchanged, version 2 already indexes this input" in str(again)
    assert sorted(p.name for p in (tmp_path / "index").glob("v0*")) == ["v000001", "v000002"]


def kill_driver_at(point: str, docs: int, tmp_path: Path, corpus: str, output: Path, model: Path) -> None:
    """Run ``jobs/index.py`` in a driver that SIGKILLs itself at ``point`` (``tests/driver_killed_at.py``)."""
    import ray

    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    job = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "driver_killed_at.py"), point, str(docs), "--",
         "--input", corpus, "--output", str(output), "--model", str(model), "--no-progress",
         "--config", str(write_yaml(tmp_path, batch_rows=8))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert job.returncode == -signal.SIGKILL, job.stderr[-3000:]


def test_killed_driver_reruns_resume_and_publish_once(ray_cluster, tmp_path, model):
    """The driver is killed at 30% of encoding, its rerun at half of what was left, and a later build between
    the version's manifest and the root's: each rerun encodes only what no finished part holds, and every
    version is published once."""
    rows = cranfield_rows(160)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", rows)
    output = tmp_path / "index"
    staging = output / "_staging"

    kill_driver_at("encode:0.3", len(rows), tmp_path, corpus, output, model)
    assert not (output / "manifest.json").exists()
    first_kill = settled_rows(staging)
    assert 0.3 * len(rows) <= first_kill <= len(rows)
    kill_driver_at("encode:0.5", len(rows) - first_kill, tmp_path, corpus, output, model)  # the rerun is killed too
    assert not (output / "manifest.json").exists()
    finished = settled_rows(staging)
    assert first_kill + 0.5 * (len(rows) - first_kill) <= finished <= len(rows)

    summary = build_index(config(corpus, str(output), model, batch_rows=8))
    assert (summary.published, summary.version) == (True, 1)
    assert summary.carried_over == finished and summary.embedded == len(rows) - finished
    assert sorted(all_ids(str(output))) == sorted(r["_id"] for r in rows)
    assert not staging.exists() or not list(staging.rglob("*.parquet"))

    # Killed while publishing: the version's folder and manifest are written, the root manifest is not.
    edited = [dict(r, text=r["text"] + " revised") for r in rows[:10]] + rows[10:]
    corpus = write_jsonl(tmp_path / "edited.jsonl", edited)
    kill_driver_at("publish", 0, tmp_path, corpus, output, model)
    assert json.loads((output / "manifest.json").read_text())["version"] == 1
    # A version number is never used twice (a stalled holder could still be writing there): the rerun publishes
    # the next one, once, and builds nothing again.
    expected = 3 if (output / "v000002").exists() else 2
    summary = build_index(config(corpus, str(output), model, batch_rows=8))
    assert (summary.published, summary.version, summary.redone, summary.embedded) == (True, expected, 0, 0)
    assert summary.carried_over == len(rows)
    assert sorted(all_ids(str(output))) == sorted(r["_id"] for r in edited)
    again = build_index(config(corpus, str(output), model, batch_rows=8))
    assert (again.published, again.version) == (False, expected)


def settled_rows(staging: Path, quiet_seconds: float = 3.0) -> int:
    """Rows in the staging parts once none has appeared for ``quiet_seconds``: Ray stops a dead driver's
    encoder actors a moment after the driver, and an actor may finish the part it was writing."""
    def rows() -> int:
        return sum(pq.read_metadata(p).num_rows for p in staging.rglob("*.parquet"))

    seen, since = rows(), time.time()
    while time.time() - since < quiet_seconds:
        time.sleep(0.2)
        if (now := rows()) != seen:
            seen, since = now, time.time()
    return seen


def write_yaml(folder: Path, **values) -> Path:
    import yaml

    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_empty_or_missing_input_fails_naming_the_url(ray_cluster, tmp_path, model):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(InputError, match=str(empty)):
        build_index(config(str(empty), str(tmp_path / "a"), model))
    missing = str(tmp_path / "nowhere")
    with pytest.raises(InputError, match=missing):
        build_index(config(missing, str(tmp_path / "b"), model))
    with pytest.raises(ConfigError, match="quantization"):
        build_index(config(str(empty), str(tmp_path / "c"), model, quantization="int4"))


# Each quantization with a FAISS index type; for int8 a second type is built from the first's carried-over vectors
# (int8 flat is what every other test builds, binary flat the evaluation job's published-index test).
@pytest.mark.parametrize(("quantization", "index_types"),
                         [("int8", ["ivf", "hnsw"]), ("binary", ["hnsw"]), ("float", ["ivf"])])
def test_parquet_input_index_types(ray_cluster, tmp_path, tiny_models, quantization, index_types):
    rows = cranfield_rows(160)
    table = pa.table({"doc": [r["_id"] for r in rows], "body": [r["text"] for r in rows]})
    pq.write_table(table, tmp_path / "corpus.parquet")
    output = str(tmp_path / "index")
    for number, index_type in enumerate(index_types, start=1):
        summary = build_index(
            config(
                str(tmp_path / "corpus.parquet"),
                output,
                tiny_models["pplx-embed"],
                id_column="doc",
                text_column="body",
                title_column=None,
                dim=32,
                quantization=quantization,
                index_type=index_type,
                nlist=4,
            )
        )
        assert (summary.version, summary.shards) == (number, 2)
        assert summary.embedded == (160 if number == 1 else 0)  # another index type reuses the vectors
        index = ShardedIndex.open(output)
        assert index.manifest["index"]["type"] == index_type and index.manifest["dim"] == 32
        vectors = index.encode_queries([r["text"] for r in rows[:20]])
        ids = index.search(vectors, k=3, nprobe=4).ids
        assert (
            sum(row[0] == r["_id"] for row, r in zip(ids, rows[:20], strict=True)) >= 18
        )  # docs find themselves

    with pytest.raises(IndexMismatchError, match=quantization):
        index.search(np.zeros((1, 32), dtype=np.float64 if quantization != "float" else np.int8), k=3)
    with pytest.raises(IndexMismatchError, match="weights"):
        ShardedIndex.open(output, model=tiny_models["bert"])


def test_centred_binary_index_scores_float_queries_against_the_stored_codes(ray_cluster, tmp_path, model):
    rows = cranfield_rows(120)
    texts = {r["_id"]: embedded_text(r["title"], r["text"]) for r in rows}
    centred = centred_model(model, tmp_path / "centred", list(texts.values())[:60])
    encoder = Encoder.from_pretrained(centred, device="cpu")
    corpus, output = write_jsonl(tmp_path / "c.jsonl", rows), str(tmp_path / "index")
    build_index(config(corpus, output, centred, quantization="binary"))
    index = ShardedIndex.open(output)
    np.testing.assert_allclose(index.binary_centre, encoder.binary_centre)  # recorded in the manifest
    ids = all_ids(output)
    stored = np.concatenate([column_matrix(t.column("vector"), np.dtype(np.uint8)) for t in shard_tables(output)])
    floats = encoder.encode([texts[i] for i in ids], quantization="float")
    np.testing.assert_array_equal(stored, np.packbits(floats > encoder.binary_centre, axis=1))

    queries = [r["title"] for r in rows[:10]]
    found = index.search(queries, k=5)  # flat: every code scored exactly with the float query
    expected = asymmetric_binary_similarity(
        binary_queries(encoder.encode(queries, quantization="float"), encoder.binary_centre), stored
    )
    np.testing.assert_allclose(found.scores, -np.sort(-expected, axis=1)[:, :5], rtol=1e-5)
    assert [hits[0] for hits in found.ids] == [ids[j] for j in expected.argmax(axis=1)]
    with pytest.raises(IndexMismatchError, match="float32 \\(centred"):
        index.search(np.packbits(floats[:1] > 0, axis=1), k=3)

    # HNSW proposes candidates by the Hamming distance of the query's signs; they are re-scored the same way
    assert build_index(config(corpus, output, centred, quantization="binary", index_type="hnsw")).embedded == 0
    hnsw = ShardedIndex.open(output).search(queries, k=5)
    assert sum(a[0] == b[0] for a, b in zip(hnsw.ids, found.ids, strict=True)) >= 9
    assert (hnsw.scores[:, 0] <= found.scores[:, 0] + 1e-6).all()

    # another centre is another encoding: nothing is reused from the version built with the first
    (centred / "binary_centre.json").write_text(encoder.binary_centre_file(list(texts.values())[60:], {}))
    assert build_index(config(corpus, output, centred, quantization="binary")).embedded == len(rows)


def test_fewer_hits_than_k_are_padded(ray_cluster, tmp_path, model):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", cranfield_rows(3))
    build_index(config(corpus, str(tmp_path / "index"), model))
    found = ShardedIndex.open(tmp_path / "index").search(["wing"], k=5)
    ids, scores = found.ids, found.scores
    assert (
        ids[0][3:] == [None, None] and np.isneginf(scores[0, 3:]).all() and np.isfinite(scores[0, :3]).all()
    )


def test_late_chunking_indexes_chunk_ids_with_offsets(ray_cluster, tmp_path, model):
    rows = cranfield_rows(30)
    output = str(tmp_path / "index")
    summary = build_index(config(write_jsonl(tmp_path / "c.jsonl", rows), output, model, chunk_tokens=16))
    table = pa.concat_tables(shard_tables(output))
    assert summary.rows == table.num_rows > len(rows)
    texts = {r["_id"]: f"{r['title']} {r['text']}".strip() for r in rows}
    for row in table.select(["id", "doc_id", "chunk", "start", "end"]).to_pylist():
        assert row["id"] == f"{row['doc_id']}#{row['chunk']}"
        assert 0 <= row["start"] < row["end"] <= len(texts[row["doc_id"]])
    first = table.filter(pa.compute.equal(table.column("doc_id"), rows[0]["_id"])).to_pylist()
    assert [r["chunk"] for r in first] == list(range(len(first))) and len(first) > 1
    assert first[-1]["end"] == len(texts[rows[0]["_id"]])
    ids = ShardedIndex.open(output).search([texts[rows[0]["_id"]][first[1]["start"] : first[1]["end"]]], k=3).ids
    assert any(i.startswith(rows[0]["_id"] + "#") for i in ids[0])


def test_job_cli_runs_on_a_small_corpus(ray_cluster, tmp_path, model, capsys):
    sys.path.insert(0, str(ROOT / "jobs"))
    import index as job

    corpus = write_jsonl(tmp_path / "c.jsonl", cranfield_rows(40))
    assert (
        job.main(
            [
                "--input",
                corpus,
                "--output",
                str(tmp_path / "out"),
                "--model",
                str(model),
                "--shard-size",
                "15",
                "--quantization",
                "binary",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "40 docs in, 40 embedded" in capsys.readouterr().out
    assert ShardedIndex.open(tmp_path / "out").manifest["quantization"] == "binary"
    with pytest.raises(ConfigError, match="shard_size"):
        job.config_from_args(job.parse_args(["--shard-size", "0"]))
    assert job.main(["--shard-size", "0"]) == 2  # a bad flag: one line naming the field, no traceback
    assert "shard_size: must be a positive integer" in capsys.readouterr().err
