"""Staging parts: the rows the encode step writes (one per input row or chunk), their schema and counts.

Torch-free: imported by the Ray tasks that write, count and assemble parts.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embedlib import storage
from embedlib.index.config import IndexJobConfig
from embedlib.index.methods import parquet_bytes

META_COLUMNS = ["doc_id", "content_hash", "reason", "source", "line"]
SPAN_TYPES = {"chunk": pa.int32(), "start": pa.int32(), "end": pa.int32(), "tokens": pa.int32()}


@dataclass
class EncodeSettings:
    """What an encoder actor needs (picklable; shipped once to every actor)."""

    method: str
    model: str
    cfg: IndexJobConfig
    types: dict[str, pa.DataType]  # the method's stored columns
    attempt: str  # this run's id: marks the rows it encoded


def part_schema(types: dict[str, pa.DataType]) -> pa.Schema:
    """Metadata, spans, the method's stored columns, then ``encoded`` and ``attempt``."""
    fields = [pa.field(name, pa.string()) for name in META_COLUMNS[:-1]]
    fields += [pa.field("line", pa.int64()), *(pa.field(n, t) for n, t in SPAN_TYPES.items())]
    fields += [pa.field(name, t) for name, t in types.items()]
    return pa.schema([*fields, pa.field("encoded", pa.bool_()), pa.field("attempt", pa.string())])


def rows_meta(batch: pa.Table, take: np.ndarray) -> dict[str, pa.Array]:
    """The metadata columns of the input rows at ``take`` (the input's ``id`` becomes ``doc_id``)."""
    picked = batch.take(pa.array(take, pa.int64()))
    return {
        "doc_id": picked.column("id").cast(pa.string()),
        "content_hash": picked.column("content_hash").cast(pa.string()),
        "reason": picked.column("reason").cast(pa.string()),
        "source": picked.column("source").cast(pa.string()),
        "line": picked.column("line").cast(pa.int64()),
    }


def part_rows(schema: pa.Schema, meta: dict, spans: dict, stored: dict, encoded: bool, attempt: str) -> pa.Table:
    """Part rows from metadata, span columns and stored columns (absent ones: nulls, as for rejects)."""
    n = len(meta["doc_id"])
    columns = dict(meta)
    for name in schema.names[len(META_COLUMNS) : -2]:
        dtype = schema.field(name).type
        given = spans.get(name, stored.get(name))
        if given is None:
            columns[name] = pa.nulls(n, dtype)
        else:
            columns[name] = given.cast(dtype) if isinstance(given, pa.Array) else pa.array(np.asarray(given), dtype)
    columns["encoded"] = pa.array(np.full(n, encoded))
    columns["attempt"] = pa.array([attempt] * n, pa.string())
    return pa.table(columns, schema=schema)


def part_name(batch: pa.Table) -> str:
    """A name that only the same input rows get (a digest of their ``source, line``): a batch retried after its
    actor or node was lost writes the same part again instead of a second copy."""
    keys = zip(batch.column("source").to_pylist(), batch.column("line").to_pylist(), strict=True)
    digest = hashlib.sha256("\n".join(f"{source}\t{line}" for source, line in keys).encode())
    return f"part-{digest.hexdigest()[:24]}"


def claim(folder: str, name: str, docs: int) -> None:
    """Record that an attempt starts encoding ``docs`` documents of part ``name`` (an empty object whose name
    says so): claims that outnumber the encoded documents count the work a lost actor, node or run had to
    have redone (``redone_docs``)."""
    fs, path = storage.filesystem(storage.join(folder, f"{name}.{docs}.{uuid.uuid4().hex[:12]}"))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, b"")  # one PUT of an empty object: atomic


def claimed_docs(folder: str) -> int:
    """Documents claimed by every encoding attempt under a staging folder's claims (see ``claim``)."""
    fs, path = storage.filesystem(folder)
    if not fs.exists(path):
        return 0
    return sum(int(name.rsplit("/", 1)[-1].split(".")[1]) for name in fs.ls(path, detail=False))


def write_part(batch: pa.Table, folder: str, rejects_folder: str, name: str) -> pa.Table:
    """Write one staging part atomically, and its rejects as jsonl beside it; returns its counts (one row)."""
    if batch.num_rows:
        rejected = batch.filter(pc.not_equal(batch.column("reason"), ""))
        if rejected.num_rows:  # written first: a part on storage always has its rejects there too
            storage.write_bytes_atomic(storage.join(rejects_folder, f"{name}.jsonl"), rejects_jsonl(rejected))
        storage.write_bytes_atomic(storage.join(folder, f"{name}.parquet"), parquet_bytes(batch))
    return pa.table({"counts": [json.dumps(part_counts(batch))]})


def rejects_jsonl(rows: pa.Table) -> bytes:
    """Rejected rows as jsonl: ``id, reason, source, line`` (URLs without credentials)."""
    lines = [
        json.dumps({"id": r["doc_id"] or None, "reason": r["reason"], "source": storage.redact_url(r["source"]),
                    "line": r["line"] if r["line"] and r["line"] > 0 else None})
        for r in rows.select(["doc_id", "reason", "source", "line"]).to_pylist()
    ]
    return ("\n".join(lines) + "\n").encode()


def part_counts(batch: pa.Table) -> dict[str, int]:
    """Rows, documents, encoded documents and rejects by reason of a part (or any batch of part rows)."""
    reasons = batch.column("reason").to_pylist()
    first = pc.fill_null(pc.equal(batch.column("chunk"), 0), True).to_numpy(zero_copy_only=False)
    encoded = batch.column("encoded").to_numpy(zero_copy_only=False)
    valid = np.array([r == "" for r in reasons], bool)
    counts = Counter(f"rejected:{r}" for r in reasons if r)
    counts.update(rows=int(valid.sum()), docs=int((valid & first).sum()), encoded=int((valid & first & encoded).sum()))
    return dict(counts)

