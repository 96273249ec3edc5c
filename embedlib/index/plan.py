"""The plan step of a build: identify the model and the input, choose the version and the staging folder.

Torch-free (the model is identified in a Ray task): ``BuildPlan`` travels to the tasks that write shards.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from dataclasses import dataclass

import pyarrow as pa
import ray

from embedlib import storage
from embedlib.config import ConfigError
from embedlib.data import default_model_path
from embedlib.index import manifest as manifests
from embedlib.index.columns import hash_hex
from embedlib.index.config import IndexJobConfig
from embedlib.index.methods import IndexMethod, index_method
from embedlib.index.reading import (
    READ_CPUS,
    check_text_column,
    input_format,
    input_snapshot,
    list_input_files,
    ray_filesystem,
)

SHUFFLE_BYTES_PER_PARTITION = 256 * 2**20
MAX_PARTITIONS = 256


@ray.remote(num_cpus=0.25)
def identify_model(method: str, model: str, cfg: IndexJobConfig) -> dict:
    """The method's identity of ``model``, computed in a worker (the model never loads in the driver)."""
    return index_method(method).identity(model, cfg)


_IDENTITIES: dict[tuple, dict] = {}


def model_identity(method: IndexMethod, model: str, cfg: IndexJobConfig) -> dict:
    """``identify_model``, remembered per checkpoint state (its files' names, sizes and change stamps)."""
    fs, path = storage.filesystem(model)
    listing = fs.find(path, detail=True) if fs.isdir(path) else {}
    stamps = tuple(sorted((name, info.get("size"), str(info.get("mtime") or info.get("ETag") or ""))
                          for name, info in listing.items()))
    key = (method.name, model, stamps, json.dumps(method.spec(cfg), sort_keys=True))
    if not stamps or key not in _IDENTITIES:
        _IDENTITIES[key] = ray.get(identify_model.remote(method.name, model, cfg))
    return _IDENTITIES[key]


@dataclass
class BuildPlan:
    """What one run decided before reading any document."""

    cfg: IndexJobConfig
    method: IndexMethod
    model: str
    out: str
    identity: dict
    key: str
    dim: int
    version: int
    base: str
    published: dict | None  # the current published manifest
    previous: dict | None  # the published manifest whose vectors can be carried over (same encoding key)
    files: list[str]
    snapshot: dict
    fingerprint: str  # what the published index would be: input snapshot, encoding key, index settings
    staging: str  # this input snapshot's staging folder: parts of this run and of killed runs before it
    attempt: str
    resumed: bool  # a killed run over the same input left finished parts there

    @property
    def unchanged(self) -> bool:
        """The published version was built from this same input snapshot, encoding and index settings."""
        return bool(self.published) and self.published.get("build_fingerprint") == self.fingerprint

    @property
    def parts(self) -> str:
        return storage.join(self.staging, "parts")

    @property
    def claims(self) -> str:
        return storage.join(self.staging, "claims")

    @property
    def staged_rejects(self) -> str:
        return storage.join(self.staging, "rejects")

    @property
    def rejects(self) -> str:
        return storage.join(self.base, "rejects")


def check_locations(cfg: IndexJobConfig) -> list[str]:
    """Input, model and output checked before Ray is used, so that a wrong location fails in seconds with
    one line; returns the input's data files."""
    files = input_files(cfg)
    check_model(model_location(cfg))
    check_output(cfg.output)
    return files


def input_files(cfg: IndexJobConfig) -> list[str]:
    """The input's data files, checked for the text column."""
    files = list_input_files(cfg.input, cfg.input_format)
    check_text_column(cfg, files, input_format(cfg, files))
    return files


def model_location(cfg: IndexJobConfig) -> str:
    return cfg.model or str(default_model_path())


def check_model(model: str) -> None:
    """``model`` must be a checkpoint folder (one with a ``config.json``); the model itself loads in workers."""
    try:
        fs, path = storage.filesystem(model)
        found = fs.isdir(path) and fs.isfile(f"{path.rstrip('/')}/config.json")
    except Exception as err:  # noqa: BLE001 - any storage failure is reported with the URL
        raise ConfigError(f"model: cannot read {storage.redact_url(model)} "
                          f"({storage.error_text(err, model)})") from None
    if not found:
        raise ConfigError(f"model: {storage.redact_url(model)} is not a checkpoint folder (no config.json there)")


def check_output(url: str) -> None:
    """The output must be a folder (or prefix) in an existing bucket that this process can write to."""
    where = storage.redact_url(url)
    try:
        fs, path = storage.filesystem(url)
        if fs.isfile(path):
            raise ConfigError(f"output: {where} is a file; give a folder or URL prefix for the index")
        if not storage.is_local(url) and not storage.bucket_exists(url):
            raise ConfigError(f"output: the bucket of {where} does not exist; create it first")
        probe = storage.join(url, "_staging", f".write-check-{uuid.uuid4().hex[:12]}")
        storage.write_bytes_atomic(probe, b"")
        probe_fs, probe_path = storage.filesystem(probe)
        probe_fs.rm(probe_path)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - a permission, network or path error: say so now, not after encoding
        raise ConfigError(f"output: cannot write to {where} "
                          f"({storage.error_text(err, url)})") from None


def plan(cfg: IndexJobConfig, files: list[str], after_version: int = 0) -> BuildPlan:
    """Identify the model and the input, and choose the version number (above every published version,
    version folder and ``after_version``) and the staging folder."""
    method = index_method(cfg.method)
    model = model_location(cfg)
    out = cfg.output.rstrip("/")
    snapshot = input_snapshot(cfg.input, files)
    identity = model_identity(method, model, cfg)
    key = manifests.encoding_key(
        identity["weights_hash"], cfg.quantization, cfg.dim, cfg.chunk_tokens, identity["max_length"],
        method.encoding_spec(cfg, identity),
    )
    published = manifests.published_manifest(out)
    version = max([published["version"] if published else 0, *manifests.version_folders(out), after_version]) + 1
    reusable = published if published and published.get("encoding_key") == key and manifests.streamable(
        published) else None
    staging = storage.join(out, "_staging", f"{key}-{snapshot['sha256'][:16]}")
    fingerprint = hashlib.sha256(json.dumps([snapshot["sha256"], key, cfg.index_settings()], sort_keys=True,
                                            default=str).encode()).hexdigest()[:32]
    return BuildPlan(
        cfg=cfg, method=method, model=model, out=out, identity=identity, key=key,
        dim=cfg.dim or identity["width"], version=version,
        base=storage.join(out, manifests.version_name(version)), published=published, previous=reusable, files=files,
        snapshot=snapshot, fingerprint=fingerprint, staging=staging, attempt=uuid.uuid4().hex[:12],
        resumed=parquet_parts_exist(storage.join(staging, "parts")),
    )


def shuffle_partitions(run: BuildPlan) -> int:
    """Hash partitions of the joins: one per ``SHUFFLE_BYTES_PER_PARTITION`` of input, at least 2."""
    size = sum(entry["size"] for entry in run.snapshot["files"])
    return max(1, min(MAX_PARTITIONS, math.ceil(size / SHUFFLE_BYTES_PER_PARTITION)))


def read_parquet(url: str | list[str], columns: list[str] | None = None) -> ray.data.Dataset:
    """Parquet files (or every ``.parquet`` under a folder) at any URL, as a lazy Ray dataset."""
    urls = [url] if isinstance(url, str) else url
    paths = [storage.filesystem(u)[1] if not storage.is_local(u) else storage.strip_file_scheme(u) for u in urls]
    dataset = ray.data.read_parquet(paths, filesystem=ray_filesystem(urls[0]), file_extensions=["parquet"],
                                    num_cpus=READ_CPUS)
    return dataset.select_columns(columns) if columns else dataset


def parquet_parts_exist(url: str) -> bool:
    fs, path = storage.filesystem(url)
    return fs.exists(path) and any(name.endswith(".parquet") for name in fs.ls(path, detail=False))


def previous_vectors(run: BuildPlan) -> ray.data.Dataset:
    """The previous version's shard rows: ``doc_id, content_hash`` (hex) and what the encoder made of them."""
    previous = run.previous
    urls = [storage.join(previous["base"], f"{s['name']}.parquet") for s in previous["shards"]]
    stored = list(run.method.vector_type(run.cfg, run.identity))
    key = "doc_id" if run.cfg.chunk_tokens else "id"
    rows = read_parquet(urls, [key, "content_hash", "chunk", "start", "end", "tokens", *stored])
    return rows.map_batches(join_keys, batch_format="pyarrow", fn_kwargs=dict(key=key))


def join_keys(batch: pa.Table, key: str) -> pa.Table:
    """Shard rows keyed like input rows: ``doc_id`` and the hex content hash."""
    batch = batch.rename_columns(["doc_id" if name == key else name for name in batch.column_names])
    return batch.set_column(batch.schema.get_field_index("content_hash"), "content_hash",
                            hash_hex(batch.column("content_hash")))
