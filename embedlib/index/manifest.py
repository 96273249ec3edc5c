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

import pyarrow.compute as pc

from embedlib import storage

MANIFEST = "manifest.json"
FORMAT = "embedlib-index/2"
READABLE_FORMATS = ("embedlib-index/1", FORMAT)
VERSION_DIR = re.compile(r"^v(\d{6})$")
SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ManifestError(ValueError):
    """A missing or unreadable manifest; the message names the URL."""


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

    ``base`` is the folder the manifest's shard names are relative to.
    """
    url = str(url).rstrip("/")
    manifest_url = url if url.endswith(".json") else storage.join(url, MANIFEST)
    try:
        manifest = json.loads(storage.read_bytes(manifest_url))
    except FileNotFoundError as err:
        raise ManifestError(f"{manifest_url}: no index manifest (nothing published at {url})") from err
    except (OSError, json.JSONDecodeError) as err:
        raise ManifestError(f"{manifest_url}: unreadable manifest ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") not in READABLE_FORMATS:
        raise ManifestError(
            f"{manifest_url}: not an embedlib index manifest (format "
            f"{manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__!r})"
        )
    check_shard_names(manifest, manifest_url)
    root = manifest_url.rsplit("/", 1)[0]
    name = root.rsplit("/", 1)[-1]
    manifest["base"] = root if VERSION_DIR.match(name) else storage.join(root, manifest["path"])
    return manifest


def check_shard_names(manifest: dict, manifest_url: str) -> None:
    """Shard names must be plain file names: a manifest never points outside its version folder."""
    for entry in manifest.get("shards") or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not SHARD_NAME.match(name):
            raise ManifestError(f"{manifest_url}: shard name {name!r} is not a plain file name")


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
    """Write the version's own manifest, then the root manifest: readers switch to it in one step."""
    data = json.dumps(manifest, indent=2, sort_keys=True).encode()
    storage.write_bytes_atomic(storage.join(url, manifest["path"], MANIFEST), data)
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
