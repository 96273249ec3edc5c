"""The streaming build holds no per-document data in the driver, on real Ray and real files."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray.data
from conftest import wait_for

from embedlib.index import IndexJobConfig, InputError, build_index
from embedlib.index.stall import PipelineStalledError, rows_or_stall

DRIVER_CALLS = ("iter_rows", "iter_batches", "take_all", "take", "take_batch", "to_pandas", "to_arrow_refs",
                "materialize", "aggregate")


class DriverRows:
    """Counts every row a ``ray.data.Dataset`` hands to the driver (and every materialization)."""

    def __init__(self, monkeypatch):
        self.rows = 0
        self.depth = 0  # Ray's own consumption calls inside an outer one are not counted again
        self.calls: list[str] = []
        for name in DRIVER_CALLS:
            monkeypatch.setattr(ray.data.Dataset, name, self.wrap(name, getattr(ray.data.Dataset, name)))

    def wrap(self, name, method):
        recorder = self

        def counted(dataset, *args, **kwargs):
            if recorder.depth:
                return method(dataset, *args, **kwargs)
            recorder.calls.append(name)
            recorder.depth += 1
            try:
                result = method(dataset, *args, **kwargs)
            finally:
                recorder.depth -= 1
            if name == "materialize":
                raise AssertionError("the build materialized a dataset (its blocks held for the driver)")
            if name in ("iter_rows", "iter_batches"):
                return recorder.count_iter(result, name)
            recorder.rows += 1 if name == "aggregate" else recorder.size(result)  # an aggregate is one row
            return result

        return counted

    def count_iter(self, items, name):
        for item in items:
            self.rows += 1 if name == "iter_rows" else self.size(item)
            yield item

    @staticmethod
    def size(result) -> int:
        if isinstance(result, pa.Table):
            return result.num_rows
        if isinstance(result, list | tuple):
            return len(result)
        if isinstance(result, dict):
            return max((len(v) for v in result.values() if hasattr(v, "__len__") and not isinstance(v, str)),
                       default=1)
        return len(result) if hasattr(result, "__len__") else 1


def write_corpus(path: Path, n: int, offset: int = 0) -> str:
    ids = [f"doc-{i}" for i in range(offset, offset + n)]
    pq.write_table(pa.table({"id": ids, "title": [""] * n,
                             "text": [f"document {i} about wings and flow number {i % 7}" for i in range(n)]}), path)
    return str(path)


def test_driver_receives_the_same_rows_whatever_the_corpus_size(ray_cluster, tmp_path, tiny_models, monkeypatch):
    """A corpus 10x larger (same shard count) hands the driver exactly as many rows: none per document."""
    received = {}
    for n in (40, 400):
        corpus = write_corpus(tmp_path / f"corpus-{n}.parquet", n)
        cfg = IndexJobConfig(input=corpus, output=str(tmp_path / f"index-{n}"), model=str(tiny_models["bert"]),
                             shard_size=1000, batch_rows=1024, show_progress=False)
        recorder = DriverRows(monkeypatch)
        summary = build_index(cfg)
        monkeypatch.undo()
        assert (summary.docs_in, summary.embedded, summary.shards) == (n, n, 1)
        received[n] = (recorder.rows, sorted(set(recorder.calls)))
    assert received[40] == received[400], received
    assert received[400][0] <= 2, received  # one count row per encoder batch, one manifest entry per shard


def test_odd_rows_are_rejected_not_fatal_and_a_beir_folder_is_its_corpus(ray_cluster, tmp_path, tiny_models):
    """Float and boolean ids, lone surrogates in an id or a text, a BOM: each row is judged on its own. A BEIR
    folder as input indexes its corpus, never its queries (whose ids would collide with the documents')."""
    rows = [{"_id": f"d{i}", "text": f"text {i}"} for i in range(3)]
    rows += [{"_id": 1.5, "text": "a"}, {"_id": True, "text": "b"}, {"_id": "\ud800", "text": "c"},
             {"_id": "surrogate-text", "text": "a \ud800 b"}]
    (tmp_path / "beir").mkdir()
    corpus = tmp_path / "beir" / "corpus.jsonl"
    corpus.write_text("\ufeff" + "".join(json.dumps(r) + "\n" for r in rows))  # a BOM before the first row
    (tmp_path / "beir" / "queries.jsonl").write_text(json.dumps({"_id": "d0", "text": "a query"}) + "\n")
    summary = build_index(IndexJobConfig(input=str(tmp_path / "beir"), output=str(tmp_path / "i"),
                                         model=str(tiny_models["bert"]), show_progress=False))
    assert (summary.docs_in, summary.embedded, summary.rejected) == (7, 3, 4)
    assert summary.rejects_by_reason == {
        "id is float, not a string or integer": 1,
        "id is bool, not a string or integer": 1,
        "id is not valid unicode (lone surrogate)": 1,
        "text is not valid unicode (lone surrogate)": 1,
    }


def test_a_missing_text_column_fails_before_any_work(tmp_path, tiny_models):
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "body": ["x", "y"]}), corpus)
    with pytest.raises(InputError, match=r"no column 'text' in c.parquet \(columns: id, body\).*--text-column"):
        build_index(IndexJobConfig(input=str(corpus), output=str(tmp_path / "i"), model=str(tiny_models["bert"])))
    assert not (tmp_path / "i").exists()


def test_one_big_file_is_cut_into_batch_rows_blocks_so_every_encoder_actor_gets_work(ray_cluster, tmp_path):
    """Ray Data merges a read task's output into one block of up to 128 MiB, and a block goes to one actor."""
    from embedlib.index.reading import read_rows

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(60)))
    cfg = IndexJobConfig(input=str(corpus), output=str(tmp_path / "i"), batch_rows=8, show_progress=False)
    per_block = read_rows(cfg, [str(corpus)]).map_batches(lambda b: {"rows": [len(b["id"])]}, batch_size=None)
    sizes = [row["rows"] for row in per_block.iter_rows()]
    assert sum(sizes) == 60 and max(sizes) <= 8 and len(sizes) >= 8, sizes


def test_a_stall_before_the_first_output_stops_the_run_once_that_output_comes(ray_cluster, tmp_path):
    """Every block takes longer than the stall timeout: the step fails with the stall error; the helper thread
    waits for the first output (Ray Data hands out no executor before it) and then the run stops, instead of
    working through the remaining blocks behind a failed step."""
    started = tmp_path / "started"
    started.mkdir()

    def slow(batch):
        (started / str(batch["id"][0])).touch()
        time.sleep(2)
        return batch

    def helper_alive() -> bool:
        return any(t.name == "embedlib-slow-step" for t in threading.enumerate())

    dataset = ray.data.range(40, override_num_blocks=40).map_batches(slow, batch_size=None)
    with pytest.raises(PipelineStalledError, match="no batch finished for 1 s"):
        list(rows_or_stall(dataset, timeout_s=1, step="slow-step"))
    wait_for(lambda: not helper_alive(), "the helper thread to end")
    at_first_output = len(list(started.iterdir()))
    time.sleep(8)  # 4 more rounds of 2 blocks, had the run gone on
    assert len(list(started.iterdir())) <= at_first_output + 2 < 40  # tasks already handed to a worker may start
