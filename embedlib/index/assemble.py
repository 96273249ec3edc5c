"""The assemble step of a build: staging parts -> shards, one Ray task per shard.

Rows are grouped by a stable hash of their document id (``groupby(shard).map_groups``), so every occurrence
of an id meets in one task: duplicate ids are rejected there. Each task writes its shard's files (parquet and
what the index method adds) and returns the manifest entry and counts; IVF/HNSW parameters come from a sample
of the parts, taken before any shard is written. Torch-free.
"""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ray.data.expressions import col
from tqdm.auto import tqdm

from embedlib import storage
from embedlib.encoding.formats import output_dtype, output_width
from embedlib.index import manifest as manifests
from embedlib.index.columns import column_matrix, hash_bytes
from embedlib.index.parts import rejects_jsonl
from embedlib.index.plan import MAX_PARTITIONS, BuildPlan, read_parquet
from embedlib.index.stall import rows_or_stall


def training_sample(run: BuildPlan, rows: int) -> np.ndarray | None:
    """At most ``train_sample`` stored vectors, sampled from the staging parts (for IVF / HNSW parameters)."""
    if not run.method.needs_training_sample(run.cfg):
        return None
    fraction = min(1.0, 1.5 * run.cfg.train_sample / max(rows, 1))
    vectors = read_parquet(run.parts, ["reason", "vector"]).filter(expr=col("reason") == "")
    if fraction < 1.0:
        vectors = vectors.random_sample(fraction, seed=0)
    dtype = output_dtype(run.cfg.quantization)
    batches = [column_matrix(b.column("vector"), dtype)
               for b in vectors.limit(run.cfg.train_sample).iter_batches(batch_format="pyarrow", batch_size=None)]
    width = output_width(run.dim, run.cfg.quantization)
    return np.concatenate(batches) if batches else np.zeros((0, width), dtype)


def shard_of(ids: list[str], shards: int) -> np.ndarray:
    """The shard of each id: a stable hash, so every occurrence of an id meets in one shard."""
    return np.array([zlib.crc32(i.encode()) % shards for i in ids], np.int32)


def assign_shards(batch: pa.Table, shards: int) -> pa.Table:
    return batch.append_column("shard", pa.array(shard_of(batch.column("doc_id").to_pylist(), shards)))


def shard_table(rows: pa.Table, chunked: bool, stored: list[str]) -> pa.Table:
    """A shard's rows in a stable order (doc id, chunk): ``id``, spans, content hash and the stored vectors.

    Late chunking indexes ``doc#k`` ids and keeps ``doc_id``; without it the id is the document's, stored once.
    Content hashes are stored as 16 raw bytes.
    """
    rows = rows.sort_by([("doc_id", "ascending"), ("chunk", "ascending")])
    doc_ids = rows.column("doc_id")
    if chunked:
        columns = {"id": pc.binary_join_element_wise(doc_ids, pc.cast(rows.column("chunk"), pa.string()), "#"),
                   "doc_id": doc_ids}
    else:
        columns = {"id": doc_ids}
    columns.update({name: rows.column(name) for name in ("chunk", "start", "end", "tokens")})
    columns["content_hash"] = hash_bytes(rows.column("content_hash"))
    columns.update({name: rows.column(name) for name in stored})
    return pa.table(columns)


def drop_copies(rows: pa.Table) -> tuple[pa.Table, int]:
    """``rows`` with one row per ``(source, line, chunk)``, and the documents dropped: the same input row written
    twice (a killed run's part that landed after its rerun had encoded the row again). Not a duplicate id."""
    keys = rows.select(["source", "line", "chunk"]).append_column("row", pa.array(np.arange(rows.num_rows)))
    firsts = keys.group_by(["source", "line", "chunk"], use_threads=False).aggregate([("row", "min")])
    if firsts.num_rows == rows.num_rows:
        return rows, 0
    kept = rows.take(firsts.column("row_min"))
    return kept, documents(rows) - documents(kept)


def documents(rows: pa.Table) -> int:
    """Documents among index rows (each has one ``chunk == 0`` row)."""
    return pc.sum(pc.equal(rows.column("chunk"), 0)).as_py() or 0


def duplicate_ids(rows: pa.Table) -> set[str]:
    """Ids that more than one input row carries (each row of a document has one ``chunk == 0`` row)."""
    firsts = rows.filter(pc.equal(rows.column("chunk"), 0)).column("doc_id")
    counts = pc.value_counts(firsts)
    return {item["values"] for item in counts.to_pylist() if item["counts"] > 1}


def write_shard(group: pa.Table, run: BuildPlan, manifest: dict, template: bytes | None) -> pa.Table:
    """Write one shard (every row of its id bucket): duplicates rejected, parquet + index files written.

    Returns one row: the shard's manifest entry and its counts, as JSON.
    """
    number = int(group.column("shard")[0].as_py())
    name = f"shard-{number:05d}"
    counts = Counter()
    group, counts["copies"] = drop_copies(group)
    duplicated = duplicate_ids(group)
    if duplicated:
        is_duplicate = pc.is_in(group.column("doc_id"), pa.array(sorted(duplicated)))
        firsts = group.filter(pc.and_(is_duplicate, pc.equal(group.column("chunk"), 0)))
        firsts = firsts.set_column(firsts.schema.get_field_index("reason"), "reason",
                                   pa.array(["duplicate id"] * firsts.num_rows, pa.string()))
        storage.write_bytes_atomic(storage.join(run.rejects, f"duplicates-{name}.jsonl"), rejects_jsonl(firsts))
        counts["rejected:duplicate id"] = firsts.num_rows
        group = group.filter(pc.invert(is_duplicate))
    stored = list(run.method.vector_type(run.cfg, run.identity))
    table = shard_table(group, run.cfg.chunk_tokens is not None, stored)
    files = run.method.shard_files(table, manifest, template)
    entry = manifests.write_shard_files(run.base, name, table, files)
    first = pc.equal(group.column("chunk"), 0)
    this_run = pc.and_(group.column("encoded"), pc.equal(group.column("attempt"), run.attempt))
    truncated = pc.and_(pc.and_(first, this_run), pc.greater_equal(group.column("tokens"), run.identity["max_length"]))
    counts.update(
        rows=table.num_rows,
        docs=pc.sum(first).as_py() or 0,
        embedded=pc.sum(pc.and_(first, this_run)).as_py() or 0,
        truncated=pc.sum(truncated).as_py() or 0,
    )
    return pa.table({"entry": [json.dumps(entry)], "counts": [json.dumps(counts)]})


def assemble(run: BuildPlan, manifest: dict, docs: int, template: bytes | None) -> tuple[list[dict], Counter]:
    """Staging parts -> shards, one Ray task per shard; returns the manifest entries and the counts."""
    shards = max(1, math.ceil(docs / run.cfg.shard_size))
    valid = read_parquet(run.parts).filter(expr=col("reason") == "")
    grouped = valid.map_batches(assign_shards, batch_format="pyarrow", fn_kwargs=dict(shards=shards))
    written = grouped.groupby("shard", num_partitions=min(shards, MAX_PARTITIONS)).map_groups(
        write_shard, batch_format="pyarrow", num_cpus=0.5,
        fn_kwargs=dict(run=run, manifest=manifest, template=template),
    )
    entries, counts = [], Counter()
    rows = rows_or_stall(written, run.cfg.stall_timeout_s, "write shards")
    for row in tqdm(rows, total=shards, desc="write shards", disable=not run.cfg.show_progress):
        entries.append(json.loads(row["entry"]))
        counts.update(json.loads(row["counts"]))
    return sorted(entries, key=lambda e: e["name"]), counts
