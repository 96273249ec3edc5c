"""``build_index``: read -> check -> tokenize -> encode (actor pool) -> sharded parquet + FAISS -> manifest.

Incremental and resumable: a document is encoded only when its content hash is in neither the current
version (built with the same encoding key) nor the staging parts an interrupted run left behind.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from tqdm.auto import tqdm

from embedlib import storage
from embedlib.encoding.encoder import Encoder
from embedlib.encoding.quantize import output_dtype, output_width
from embedlib.index import manifest as manifests
from embedlib.index.config import IndexJobConfig, IndexSummary
from embedlib.index.encode_stage import column_matrix, encode_rows, vectors_column
from embedlib.index.faiss_shards import default_params, shard_index, trained_template
from embedlib.index.reading import InputError, input_snapshot, ray_filesystem, read_rows
from embedlib.index.representative_shards import DEFAULT_PARAMS, SPARSE_COLUMNS
from embedlib.models.loading import default_model_path

log = logging.getLogger(__name__)
VECTOR_COLUMNS = ["content_hash", "chunk", "start", "end", "tokens", "vector"]


class RejectedRowsError(ValueError):
    """``strict`` run with rejected rows; the message gives the counts and where the rejects were written."""


def ensure_ray() -> None:
    """Connect to the cluster (``RAY_ADDRESS``, as under ``ray job submit``) or start a local Ray."""
    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True)


def model_identity(model: str, cfg: IndexJobConfig) -> dict:
    """``weights_hash``, ``max_length`` and ``width`` (and, for DiffRetriever, ``vocab_size``) of the model."""
    if cfg.method == "diffretriever":
        from embedlib.encoding.representative_tokens import DiffRetrieverEncoder

        lm = DiffRetrieverEncoder.from_pretrained(model, device="cpu", top_terms=cfg.top_terms)
        return {"weights_hash": lm.weights_hash, "max_length": lm.max_length, "width": lm.dim,
                "vocab_size": lm.vocab_size}
    encoder = Encoder.from_pretrained(model, device="cpu")
    return {"weights_hash": encoder.weights_hash, "max_length": encoder.max_length, "width": encoder.dim}


def method_spec(cfg: IndexJobConfig) -> dict | None:
    """What, besides the model, decides a DiffRetriever encoding (None for the dense method)."""
    if cfg.method != "diffretriever":
        return None
    return {"method": cfg.method, "k_passage": cfg.k_passage, "top_terms": cfg.top_terms}


def read_catalog(rows: ray.data.Dataset, url: str) -> tuple[ray.data.Dataset, pd.DataFrame]:
    """The checked rows, materialized, and every row without its text (``id, content_hash, reason, source,
    line``) with duplicate ids marked."""
    try:
        rows = rows.materialize()
        catalog = rows.select_columns(["id", "content_hash", "reason", "source", "line"]).to_pandas()
    except Exception as err:  # noqa: BLE001 - read failures surface here, in the streaming executor
        raise InputError(f"{url}: cannot read input ({type(err).__name__}: {str(err)[:500]})") from err
    if catalog.empty:
        raise InputError(f"{url}: input is empty (no rows)")
    valid = catalog["reason"] == ""
    catalog.loc[valid & catalog["id"].where(valid).duplicated(keep=False), "reason"] = "duplicate id"
    return rows, catalog


def write_rejects(url: str, rejects: pd.DataFrame) -> None:
    lines = [
        json.dumps(
            {
                "id": r.id or None,
                "reason": r.reason,
                "source": manifests.redact_url(r.source),
                "line": int(r.line) if r.line >= 0 else None,
            }
        )
        for r in rejects.itertuples()
    ]
    storage.write_bytes_atomic(url, ("\n".join(lines) + "\n").encode())


def parquet_files(url: str) -> list[str]:
    fs, path = storage.filesystem(url)
    return sorted(f for f in fs.find(path) if f.endswith(".parquet")) if fs.exists(path) else []


def read_vectors(url: str, files: list[str], needed: set[str], columns: list[str]) -> pa.Table | None:
    """Rows of ``columns`` from parquet ``files`` whose content hash is in ``needed``."""
    fs, _ = storage.filesystem(url)
    tables = []
    for path in files:
        table = pq.read_table(path, columns=columns, filesystem=fs)
        keep = np.fromiter(
            (h in needed for h in table.column("content_hash").to_pylist()), bool, table.num_rows
        )
        tables.append(table.filter(pa.array(keep)))
    return pa.concat_tables(tables) if tables else None


def known_hashes(url: str, files: list[str]) -> set[str]:
    fs, _ = storage.filesystem(url)
    return {
        h
        for f in files
        for h in pq.read_table(f, columns=["content_hash"], filesystem=fs).column("content_hash").to_pylist()
    }


def shard_rows(docs: pd.DataFrame, vectors: pa.Table, chunked: bool) -> tuple[pd.DataFrame, np.ndarray]:
    """Index rows in document order (one per doc, or per chunk) and the position of each one's vector."""
    meta = vectors.drop_columns(["vector"]).to_pandas()
    meta["position"] = np.arange(len(meta))
    meta = meta.drop_duplicates(["content_hash", "chunk"])
    rows = docs.reset_index(drop=True).rename_axis("order").reset_index().merge(meta, on="content_hash")
    rows = rows.sort_values(["order", "chunk"], kind="stable").reset_index(drop=True)
    rows["doc_id"] = rows["id"]
    if chunked:
        rows["id"] = rows["doc_id"] + "#" + rows["chunk"].astype(str)
    return rows, rows["position"].to_numpy()


def write_shard_files(base: str, name: str, table: pa.Table, files: dict[str, bytes]) -> dict:
    """Write ``<name>.<suffix>`` for each of a shard's files; returns its manifest entry (with checksums)."""
    for suffix, data in files.items():
        storage.write_bytes_atomic(storage.join(base, f"{name}.{suffix}"), data)
    return {
        "name": name,
        "rows": table.num_rows,
        "docs": len(set(table.column("doc_id").to_pylist())),
        "bytes": sum(len(data) for data in files.values()),
        **{f"{suffix.split('.')[0]}_sha256": hashlib.sha256(data).hexdigest() for suffix, data in files.items()},
    }


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


@ray.remote(num_cpus=0.5)
def write_shard(
    base: str, name: str, table: pa.Table, template: bytes, quantization: str, dim: int, params: dict
) -> dict:
    """Write one shard's parquet and FAISS index; returns its manifest entry."""
    vectors = (
        column_matrix(table.column("vector"), output_dtype(quantization))
        if table.num_rows
        else np.zeros((0, output_width(dim, quantization)), output_dtype(quantization))
    )
    files = {"parquet": parquet_bytes(table), "faiss": shard_index(template, vectors, quantization, params)}
    return write_shard_files(base, name, table, files)


@ray.remote(num_cpus=0.5)
def write_representative_shard(
    base: str, name: str, table: pa.Table, k: int, dim: int, vocab_size: int, params: dict
) -> dict:
    """Write one DiffRetriever shard (parquet, multi-vector FAISS, postings); returns its manifest entry."""
    from embedlib.index.representative_shards import shard_index_files

    files = {"parquet": parquet_bytes(table), **shard_index_files(table, k, dim, vocab_size, params)}
    return write_shard_files(base, name, table, files)


def shard_writer(cfg: IndexJobConfig, base: str, vectors: pa.Table, positions: np.ndarray, dim: int,
                 identity: dict) -> tuple[dict, Callable[[str, pa.Table, np.ndarray], ray.ObjectRef]]:
    """The index parameters, and ``submit(name, rows, take)``: start writing one shard whose rows are
    ``rows`` (metadata) with the vectors at ``take`` of the index's row order."""
    if cfg.method == "diffretriever":
        params = dict(DEFAULT_PARAMS)
        stored = vectors.select(["vector", *SPARSE_COLUMNS]).take(pa.array(positions))

        def submit_representative(name: str, table: pa.Table, take: np.ndarray) -> ray.ObjectRef:
            for column in ["vector", *SPARSE_COLUMNS]:
                table = table.append_column(column, stored.column(column).take(pa.array(take)))
            return write_representative_shard.remote(
                base, name, table, cfg.k_passage, dim, identity["vocab_size"], params
            )

        return params, submit_representative
    matrix = column_matrix(vectors.column("vector"), output_dtype(cfg.quantization))[positions]
    sample = matrix[np.random.default_rng(0).permutation(len(matrix))[: cfg.train_sample]]
    params = default_params(cfg.index_type, cfg.quantization, dim, sample, len(matrix), cfg)
    template = ray.put(trained_template(cfg.quantization, cfg.index_type, dim, params, sample))

    def submit_dense(name: str, table: pa.Table, take: np.ndarray) -> ray.ObjectRef:
        table = table.append_column("vector", vectors_column(matrix[take]))
        return write_shard.remote(base, name, table, template, cfg.quantization, dim, params)

    return params, submit_dense


def encode_missing(
    rows: ray.data.Dataset, todo: set[str], cfg: IndexJobConfig, model: str, staging: str
) -> None:
    """Encode the rows whose content hash is in ``todo`` and write them as parquet parts under ``staging``."""
    pending = rows.filter(lambda row: row["content_hash"] in todo).select_columns(
        ["content_hash", "title", "text"]
    )
    encoded = encode_rows(pending, cfg, model)
    filesystem = ray_filesystem(staging)
    path = storage.filesystem(staging)[1] if filesystem else storage.strip_file_scheme(staging)
    encoded.write_parquet(path, filesystem=filesystem)


def build_index(config: IndexJobConfig) -> IndexSummary:
    """Run the whole indexing job for ``config`` and publish a new index version; returns its summary."""
    cfg = config.validate()
    started = time.perf_counter()
    model = cfg.model or str(default_model_path())
    out = cfg.output.rstrip("/")
    ensure_ray()
    ray.data.DataContext.get_current().enable_progress_bars = cfg.show_progress

    rows_ds, files = read_rows(cfg)
    rows, catalog = read_catalog(rows_ds, cfg.input)
    identity = model_identity(model, cfg)
    weights_hash, max_length = identity["weights_hash"], identity["max_length"]
    key = manifests.encoding_key(
        weights_hash, cfg.quantization, cfg.dim, cfg.chunk_tokens, max_length, method_spec(cfg)
    )
    dim = cfg.dim or identity["width"]
    diffretriever = cfg.method == "diffretriever"
    columns_in = VECTOR_COLUMNS + (SPARSE_COLUMNS if diffretriever else [])

    previous = manifests.published_manifest(out)
    version = max([previous["version"] if previous else 0, *manifests.version_folders(out)]) + 1
    base = storage.join(out, manifests.version_name(version))
    rejects = catalog[catalog["reason"] != ""]
    rejects_url = storage.join(base, "rejects.jsonl") if len(rejects) else None
    if rejects_url:
        write_rejects(rejects_url, rejects)
    counts = rejects["reason"].value_counts().to_dict()
    if cfg.strict and len(rejects):
        raise RejectedRowsError(f"{cfg.input}: {len(rejects)} rows rejected ({counts}); see {rejects_url}")

    docs = catalog.loc[catalog["reason"] == "", ["id", "content_hash"]]
    staging = storage.join(out, "_staging", key)
    reusable = (
        [storage.join(previous["base"], f"{s['name']}.parquet") for s in previous["shards"]]
        if previous and previous.get("encoding_key") == key
        else []
    )
    sources = [*reusable, *(full_url(staging, f) for f in parquet_files(staging))]
    carried = known_hashes(out, sources) & set(docs["content_hash"])
    todo = set(docs["content_hash"]) - carried
    encode_started = time.perf_counter()
    if todo:
        encode_missing(rows, todo, cfg, model, staging)
    encode_seconds = time.perf_counter() - encode_started

    sources = [*reusable, *(full_url(staging, f) for f in parquet_files(staging))]
    vectors = read_vectors(out, sources, set(docs["content_hash"]), columns_in)
    index_rows, positions = shard_rows(docs, vectors, cfg.chunk_tokens is not None)
    missing = set(docs["content_hash"]) - set(index_rows["content_hash"])
    if missing:
        raise RuntimeError(
            f"{len(missing)} documents have no vector after encoding (e.g. {sorted(missing)[:3]})"
        )
    params, submit = shard_writer(cfg, base, vectors, positions, dim, identity)
    shard_of = index_rows["order"].to_numpy() // cfg.shard_size
    columns = ["id", "doc_id", "chunk", "start", "end", "tokens", "content_hash"]
    pending = []
    for shard in range(int(shard_of.max()) + 1 if len(shard_of) else 0):
        take = np.flatnonzero(shard_of == shard)
        table = pa.Table.from_pandas(index_rows.loc[take, columns], preserve_index=False)
        pending.append(submit(f"shard-{shard:05d}", table, take))
    shards = [ray.get(ref) for ref in tqdm(pending, desc="write shards", disable=not cfg.show_progress)]

    manifest = {
        "format": manifests.FORMAT,
        "version": version,
        "path": manifests.version_name(version),
        "created_at": datetime.now(UTC).isoformat(),
        "model": {
            "source": manifests.redact_url(model),
            "weights_hash": weights_hash,
            "max_length": max_length,
        },
        "encoding_key": key,
        "method": cfg.method,
        "quantization": "float" if diffretriever else cfg.quantization,
        "dim": dim,
        "chunk_tokens": cfg.chunk_tokens,
        "index": {"type": "multivector+sparse" if diffretriever else cfg.index_type, "params": params},
        "input": input_snapshot(cfg.input, files) | {"url": manifests.redact_url(cfg.input)},
        "shards": shards,
        "counts": {
            "docs_in": len(catalog),
            "docs": len(docs),
            "rows": len(index_rows),
            "rejected": len(rejects),
            "rejects_by_reason": counts,
            "embedded": int(docs["content_hash"].isin(todo).sum()),
            "carried_over": int(docs["content_hash"].isin(carried).sum()),
        },
        "rejects": "rejects.jsonl" if rejects_url else None,
    }
    if diffretriever:
        manifest.update(k_passage=cfg.k_passage, k_query=cfg.k_query, top_terms=cfg.top_terms,
                        vocab_size=identity["vocab_size"])
    manifests.publish(out, manifest)
    fs, staging_path = storage.filesystem(staging)
    if fs.exists(staging_path):
        fs.rm(staging_path, recursive=True)
    manifests.prune_versions(out, version, cfg.keep_versions)

    total_bytes = sum(s["bytes"] for s in shards)
    truncated = int(((index_rows["tokens"] >= max_length) & (index_rows["chunk"] == 0)).sum())
    return IndexSummary(
        url=manifests.redact_url(out),
        version=version,
        docs_in=len(catalog),
        embedded=manifest["counts"]["embedded"],
        carried_over=manifest["counts"]["carried_over"],
        rejected=len(rejects),
        rejects_by_reason=counts,
        rejects_url=rejects_url,
        shards=len(shards),
        rows=len(index_rows),
        bytes_per_doc=total_bytes / max(1, len(docs)),
        seconds=time.perf_counter() - started,
        encode_seconds=encode_seconds,
        truncated=truncated,
    )


def full_url(reference: str, path: str) -> str:
    """A filesystem-internal ``path`` as a URL of the same scheme as ``reference``."""
    if storage.is_local(reference):
        return path
    return f"{reference.split('://', 1)[0]}://{path}"
