"""Index manifests: one JSON per published version, the root ``manifest.json`` naming the current one.

Layout under an index URL::

    manifest.json              the current version's manifest (written last, atomically)
    v000002/manifest.json      every published version keeps its own copy (older versions stay readable)
    v000002/shard-00000.parquet, shard-00000.faiss (IVF/HNSW only), rejects/part-*.jsonl
    _staging/<encoding key>-<input snapshot>/parts/   rows of runs not yet published (what a rerun resumes from)

Format 2 (``embedlib-index/2``, the streaming build) adds ``doc_id``-keyed carry-over and writes no FAISS file for
flat shards; format 1 indexes stay readable (a build over one re-embeds, since its rows were not keyed that way).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from embedlib import storage
from embedlib.encoding.formats import QUANTIZATIONS
from embedlib.errors import UserError
from embedlib.index.columns import vector_bytes

MANIFEST = "manifest.json"
FORMAT = "embedlib-index/2"
READABLE_FORMATS = ("embedlib-index/1", FORMAT)
VERSION_DIR = re.compile(r"^v(\d{6})$")
SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")

# What readers use, by type: every readable manifest (formats 1 and 2 alike) has these fields...
MANIFEST_FIELDS = {"format": str, "version": int, "path": str, "model": dict, "dim": int, "quantization": str,
                   "index": dict, "shards": list}
MODEL_FIELDS = {"source": str, "weights_hash": str}
INDEX_FIELDS = {"type": str, "params": dict}
SHARD_FIELDS = {"name": str, "rows": int, "parquet_sha256": str}
# ... and each method adds its own (to the manifest, and to every shard entry).
METHOD_FIELDS = {"dense": {}, "diffretriever": {"k_passage": int, "k_query": int, "top_terms": int}}
METHOD_SHARD_FIELDS = {"dense": {}, "diffretriever": {"faiss_sha256": str, "postings_sha256": str}}
KIND_NAMES = {int: "an integer", str: "a string", dict: "an object", list: "a list"}


class ManifestError(UserError, ValueError):
    """A missing, unreadable or malformed manifest, or a shard that disagrees with it; the message names the file
    (credentials redacted)."""


def version_name(version: int) -> str:
    return f"v{version:06d}"


def encoding_key(
    weights_hash: str,
    quantization: str,
    dim: int | None,
    chunk_tokens: int | None,
    max_length: int,
    method: dict | None = None,
) -> str:
    """What decides whether an embedding can be reused: model weights and how vectors were made from them."""
    parts = [weights_hash, quantization, dim, chunk_tokens, max_length]
    spec = json.dumps(parts if method is None else [*parts, method], sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:24]


def read_manifest(url: str) -> dict:
    """The manifest at ``url`` (an index root, a version folder, or a manifest file), with ``base`` set.

    ``base`` is the folder the manifest's shard names are relative to. A manifest without the fields and types
    its readers use is refused (``check_schema``).
    """
    url = str(url).rstrip("/")
    manifest_url = url if url.endswith(".json") else storage.join(url, MANIFEST)
    where = storage.redact_url(manifest_url)
    try:
        data = storage.read_bytes(manifest_url)
    except FileNotFoundError:
        raise ManifestError(f"{where}: no index manifest (nothing published at {storage.redact_url(url)})") from None
    except Exception as err:  # noqa: BLE001 - any storage failure is reported with the (redacted) URL
        raise ManifestError(
            f"{where}: unreadable manifest ({storage.error_text(err, manifest_url)})"
        ) from None  # the cause's text may hold the URL's credentials
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ManifestError(f"{where}: unreadable manifest ({err})") from err
    check_schema(manifest, where)
    root = manifest_url.rsplit("/", 1)[0]
    name = root.rsplit("/", 1)[-1]
    manifest["base"] = root if VERSION_DIR.match(name) else storage.join(root, manifest["path"])
    return manifest


def check_schema(manifest: object, where: str) -> None:
    """Refuse (``ManifestError`` naming ``where``) a manifest that lacks a field its readers use or has one of the
    wrong type: ``MANIFEST_FIELDS``, those of its method, and per shard a plain file name, a row count and a
    sha256 checksum of each file."""
    if not isinstance(manifest, dict) or manifest.get("format") not in READABLE_FORMATS:
        raise ManifestError(
            f"{where}: not an embedlib index manifest (format "
            f"{manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__!r})"
        )
    check_fields(manifest, MANIFEST_FIELDS, where)
    check_fields(manifest["model"], MODEL_FIELDS, where, "model")
    check_fields(manifest["index"], INDEX_FIELDS, where, "index")
    method = manifest.get("method", "dense")
    if method not in METHOD_FIELDS:
        raise ManifestError(f"{where}: method must be one of {tuple(METHOD_FIELDS)}, got {method!r}")
    check_fields(manifest, METHOD_FIELDS[method], where)
    if manifest["quantization"] not in QUANTIZATIONS:
        raise ManifestError(f"{where}: quantization must be one of {QUANTIZATIONS}, got {manifest['quantization']!r}")
    if not VERSION_DIR.match(manifest["path"]):
        raise ManifestError(f"{where}: path {manifest['path']!r} is not a version folder name (vNNNNNN)")
    if manifest["dim"] < 1:
        raise ManifestError(f"{where}: dim must be >= 1, got {manifest['dim']}")
    for number, entry in enumerate(manifest["shards"]):
        check_shard_entry(entry, SHARD_FIELDS | METHOD_SHARD_FIELDS[method], where, f"shards[{number}]")


def check_shard_entry(entry: object, fields: dict[str, type], where: str, label: str) -> None:
    """One shard entry: ``fields`` with their types, a plain file name, rows >= 0, sha256 checksums."""
    if not isinstance(entry, dict):
        raise ManifestError(f"{where}: {label} must be an object, got {type(entry).__name__}")
    check_fields(entry, fields, where, label)
    check_shard_name(entry["name"], where)
    if entry["rows"] < 0:
        raise ManifestError(f"{where}: {label}.rows must be >= 0, got {entry['rows']}")
    for key, value in entry.items():
        if key.endswith("_sha256") and not (isinstance(value, str) and SHA256.match(value)):
            raise ManifestError(f"{where}: {label}.{key} is not a sha256 checksum: {value!r}")


def check_fields(value: dict, fields: dict[str, type], where: str, label: str = "") -> None:
    """Every one of ``fields`` is in ``value`` with its type (``label`` names ``value`` inside the manifest)."""
    for name, kind in fields.items():
        if name not in value:
            raise ManifestError(f"{where}: {label + ': ' if label else ''}missing field {name!r}")
        found = value[name]
        if not isinstance(found, kind) or (kind is int and isinstance(found, bool)):
            raise ManifestError(
                f"{where}: {label + '.' if label else ''}{name} must be {KIND_NAMES[kind]}, got {type(found).__name__}"
            )


def check_shard_name(name: str, where: str) -> None:
    """Shard names must be plain file names: a manifest never points outside its version folder."""
    if not SHARD_NAME.match(name):
        raise ManifestError(f"{where}: shard name {name!r} is not a plain file name")


def check_shard_count(url: str, found: int, expected: int, what: str = "rows") -> None:
    """A shard file (at ``url``) holds as many rows (or vectors) as its manifest entry says; else ``ManifestError``."""
    if found != expected:
        raise ManifestError(f"{storage.redact_url(url)}: {found} {what}, the manifest says {expected}")


def check_vector_width(url: str, column: pa.ChunkedArray | pa.Array, expected: int, what: str) -> None:
    """A shard file's stored vectors are ``expected`` bytes wide, as the manifest's ``what`` makes them."""
    found = vector_bytes(column)
    if found != expected:
        raise ManifestError(
            f"{storage.redact_url(url)}: vectors of {found} bytes, the manifest's {what} needs {expected}"
        )


def streamable(manifest: dict) -> bool:
    """Whether a build can carry this version's vectors over (format 2 shards are keyed by doc id)."""
    return manifest.get("format") == FORMAT


def write_shard_files(base: str, name: str, table, files: dict[str, bytes]) -> dict:
    """Write ``<name>.<suffix>`` for each of a shard's files; returns its manifest entry (with checksums)."""
    for suffix, data in files.items():
        storage.write_bytes_atomic(storage.join(base, f"{name}.{suffix}"), data)
    return {
        "name": name,
        "rows": table.num_rows,
        "docs": pc.count_distinct(table.column("doc_id" if "doc_id" in table.column_names else "id")).as_py(),
        "bytes": sum(len(data) for data in files.values()),
        **{f"{suffix.split('.')[0]}_sha256": hashlib.sha256(data).hexdigest() for suffix, data in files.items()},
    }


def published_manifest(url: str) -> dict | None:
    """The current manifest at an index root, or None when nothing was published there yet."""
    if not storage.exists(storage.join(url, MANIFEST)):
        return None
    return read_manifest(url)


def version_folders(url: str) -> dict[int, str]:
    """Version number -> folder path (filesystem-internal) of every ``vNNNNNN`` folder under ``url``."""
    fs, path = storage.filesystem(url)
    if not fs.exists(path):
        return {}
    found = {}
    for entry in fs.ls(path, detail=False):
        match = VERSION_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
        if match:
            found[int(match.group(1))] = entry
    return found


def publish(url: str, manifest: dict) -> None:
    """Write the version's own manifest (create-only: a version number is published once, ever), then the
    root manifest unless it already names a newer version: readers switch to the new one in one step."""
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    version_manifest = storage.join(url, manifest["path"], MANIFEST)
    try:
        storage.write_bytes_create_only(version_manifest, data)
    except FileExistsError:
        raise ManifestError(f"{storage.redact_url(version_manifest)}: version {manifest['version']} was already "
                            "published by another build; nothing published, rerun the job") from None
    current = published_manifest(url)
    if current and current["version"] > manifest["version"]:
        raise ManifestError(f"{storage.redact_url(url)}: version {current['version']} was published meanwhile, "
                            f"newer than this build's {manifest['version']}; the root manifest is left as it is")
    storage.write_bytes_atomic(storage.join(url, MANIFEST), data)


def prune_versions(url: str, keep: int, grace_seconds: float) -> list[int]:
    """Delete old versions; returns their numbers.

    Only published versions count: the ``keep`` newest of them stay, and so does any version published less
    than ``grace_seconds`` ago (a reader may still hold it). Folders of runs that never published and are
    older than the newest published version are leftovers of killed runs and go.
    """
    fs, _ = storage.filesystem(url)
    folders = version_folders(url)
    published = {v: path for v, path in folders.items() if fs.exists(f"{path.rstrip('/')}/{MANIFEST}")}
    if not published:
        return []
    newest = max(published)
    kept = set(sorted(published)[-keep:])
    now = time.time()
    removed = []
    for version, path in sorted(folders.items()):
        if version in published:
            expired = version not in kept and now - published_at(f"{path.rstrip('/')}/{MANIFEST}", fs) > grace_seconds
        else:
            expired = version < newest
        if expired:
            fs.rm(path, recursive=True)
            removed.append(version)
    return removed


def published_at(manifest_path: str, fs) -> float:
    """When a version was published (its manifest's ``created_at``), as a Unix time; 0 when unknown."""
    try:
        created = json.loads(fs.cat_file(manifest_path)).get("created_at")
        return datetime.fromisoformat(created).timestamp()
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0
