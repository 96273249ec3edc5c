"""``build_index``: a streaming, driver-free build in four named steps, like ColBERT's ``CollectionIndexer``.

    plan      (``plan.py``) identify the model (a Ray task), the encoding key, the previous version and the
              run's staging folder
    encode    (``encode_stage.py``) read -> check -> [anti-join finished staging parts] -> [join the previous
              version's vectors by (id, content_hash)] -> encoder actor pool, which writes parts and rejects
    assemble  (``assemble.py``) parts -> one shard per hash bucket of the id (``groupby(shard).map_groups``):
              duplicate ids rejected, parquet + index files written by the shard's task
    publish   the version's manifest (create-only), then the root manifest (atomically); the staging folder
              is removed

The whole run holds the output's publish lease (``lease.py``): a second build into the same output fails at
once with ``LeaseHeldError`` (or waits ``lease_wait_seconds``), before it reads or writes anything there.

No step holds per-document data in the driver: rows, hashes and vectors stay in Ray Data's streams and in
files written by tasks. The driver holds the plan, one count row per encoder batch (added up as it streams
by), one manifest entry per shard, and counts.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from datetime import UTC, datetime

import ray

from embedlib import storage
from embedlib.errors import UserError
from embedlib.index import manifest as manifests
from embedlib.index.assemble import assemble, training_sample
from embedlib.index.config import IndexJobConfig, IndexSummary
from embedlib.index.encode_stage import encode_to_parts
from embedlib.index.lease import PublishLease, held_lease
from embedlib.index.parts import EncodeSettings, claimed_docs, part_counts
from embedlib.index.plan import (
    BuildPlan,
    check_locations,
    parquet_parts_exist,
    plan,
    previous_vectors,
    read_parquet,
    shuffle_partitions,
)
from embedlib.index.reading import InputError, read_rows
from embedlib.index.stall import rows_or_stall
from embedlib.local_ray import keep_idle_workers

SHUFFLE_ACTOR_CPUS = 0.05
MIN_KEPT_FRACTION = 0.5  # a new version with fewer of the current version's documents needs ``allow_shrink``


class RejectedRowsError(UserError, ValueError):
    """``strict`` run with rejected rows; the message gives the counts and where the rejects were written."""


class ShrinkError(UserError, ValueError):
    """A new version would drop most of the published one (a wrong input, column or filter, most likely)."""


class StorageLostDataError(RuntimeError):
    """Rows the encode step wrote to staging were not there when the shards were assembled."""


def ensure_ray() -> None:
    """Connect to the cluster (``RAY_ADDRESS``, as under ``ray job submit``) or start a local Ray without the
    dashboard (a one-off local run does not need it; Ray ignores the flag when it connects to a cluster)."""
    if not ray.is_initialized():
        keep_idle_workers()  # for a Ray started here; a cluster joined keeps its own setting
        ray.init(ignore_reinit_error=True, include_dashboard=False)


def configure_ray_data(cfg: IndexJobConfig) -> None:
    """Progress bars as asked; shuffle actors ask for a sliver of a CPU, so that a cluster whose CPUs
    are all held (encoder actors, shard-serving actors) still runs them instead of waiting for minutes."""
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = cfg.show_progress
    if not cfg.show_progress:  # asked for: Ray Data's warning that progress bars are off is noise
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    context.hash_shuffle_operator_actor_num_cpus_override = SHUFFLE_ACTOR_CPUS
    context.hash_aggregate_operator_actor_num_cpus_override = SHUFFLE_ACTOR_CPUS
    # Lost actors and nodes are retried (``encode_to_parts``); an error raised by our own code is not, and one
    # failed block fails the run (never a published index with a block missing).
    context.actor_task_retry_on_errors = False
    context.max_errored_blocks = 0


def encode(run: BuildPlan) -> tuple[Counter, float]:
    """Write every input row once into staging parts (see ``encode_stage``); returns this run's part counts."""
    started = time.perf_counter()
    rows = read_rows(run.cfg, run.files)
    partitions = shuffle_partitions(run)
    if run.resumed:  # a killed run over the same input left finished parts: skip their rows
        done = read_parquet(run.parts, ["source", "line"])
        rows = rows.join(done, "left_anti", partitions, on=("source", "line"))
    if run.previous:
        rows = rows.join(previous_vectors(run), "left_outer", partitions, on=("id", "content_hash"),
                         right_on=("doc_id", "content_hash"))
    settings = EncodeSettings(run.method.name, run.model, run.cfg,
                              run.method.vector_type(run.cfg, run.identity), run.attempt)
    parts = encode_to_parts(rows, settings, run.parts, run.staged_rejects, run.claims)
    counts = sum_counts(parts, run.cfg.stall_timeout_s, "encode")
    return counts, time.perf_counter() - started


def sum_counts(dataset: ray.data.Dataset, stall_timeout_s: float, step: str) -> Counter:
    """The sum of a dataset's ``counts`` column (one JSON counter per batch), added up as it streams by;
    ``PipelineStalledError`` when no batch comes for ``stall_timeout_s``."""
    counts: Counter = Counter()
    for row in rows_or_stall(dataset, stall_timeout_s, step):
        counts.update(json.loads(row["counts"]))
    return counts


def tally_parts(run: BuildPlan) -> Counter:
    """Counts over every staging part of this input (this run's and a killed run's alike)."""
    parts = read_parquet(run.parts, ["reason", "chunk", "encoded"])
    return sum_counts(parts.map_batches(lambda b: {"counts": [json.dumps(part_counts(b))]},
                                        batch_format="pyarrow", batch_size=None),
                      run.cfg.stall_timeout_s, "count staging parts")


@ray.remote(num_cpus=0.1)
def count_claims(folder: str) -> int:
    """``claimed_docs`` in a worker: the claims' listing (one name per encoded batch) stays out of the driver."""
    return claimed_docs(folder)


def redone_docs(run: BuildPlan, totals: Counter, shard_counts: Counter) -> int:
    """Documents encoded more than once: those claimed by every attempt (retries and killed runs included),
    less those encoded into the parts; a resumed run's totals count both copies of a row that a killed run and
    its rerun wrote, so the copies are added back."""
    claimed = ray.get(count_claims.remote(run.claims))
    copies = shard_counts["copies"] if run.resumed else 0
    return max(0, claimed - totals["encoded"]) + copies


def move_rejects(run: BuildPlan) -> None:
    """Move the rejects the encode tasks wrote (one jsonl per part, in staging) into the version's folder.

    A rejects file whose part is missing belongs to a killed task: its rows were redone, so it is dropped.
    """
    fs, staged = storage.filesystem(run.staged_rejects)
    if not fs.exists(staged):
        return
    _, parts = storage.filesystem(run.parts)
    written = {path.rsplit("/", 1)[-1].removesuffix(".parquet") for path in fs.ls(parts, detail=False)}
    _, target = storage.filesystem(run.rejects)
    fs.makedirs(target, exist_ok=True)
    for path in fs.ls(staged, detail=False):
        name = path.rsplit("/", 1)[-1]
        if name.endswith(".jsonl") and name.removesuffix(".jsonl") in written:
            fs.mv(path, f"{target.rstrip('/')}/{name}")


def reject_counts(counts: Counter) -> dict[str, int]:
    return {key.split(":", 1)[1]: n for key, n in counts.items() if key.startswith("rejected:") and n}


def check_rejects(run: BuildPlan, rejected: dict[str, int]) -> None:
    """``strict``: any reject fails the run, naming where the rejects were written."""
    if run.cfg.strict and rejected:
        raise RejectedRowsError(
            f"{storage.redact_url(run.cfg.input)}: {sum(rejected.values())} rows rejected ({rejected}); "
            f"see {storage.redact_url(run.rejects)}"
        )


def version_manifest(run: BuildPlan, params: dict) -> dict:
    """The manifest of the version being built, without its shards and counts."""
    return {
        "format": manifests.FORMAT,
        "version": run.version,
        "path": manifests.version_name(run.version),
        "model": {"source": storage.redact_url(run.model), "weights_hash": run.identity["weights_hash"],
                  "max_length": run.identity["max_length"]},
        "encoding_key": run.key,
        "method": run.method.name,
        "dim": run.dim,
        "chunk_tokens": run.cfg.chunk_tokens,
        "input": run.snapshot | {"url": storage.redact_url(run.cfg.input)},
        "build_fingerprint": run.fingerprint,
        **run.method.manifest_fields(run.cfg, run.identity, params),
    }


def publish(run: BuildPlan, manifest: dict, lease: PublishLease) -> None:
    """Publish the version atomically (if this build still holds the lease), remove this input's staging
    folder and prune old versions."""
    manifest["created_at"] = datetime.now(UTC).isoformat()
    lease.renew()  # LeaseLostError if another build took the index over: it may be publishing now
    manifests.publish(run.out, manifest)
    remove_staging(run)
    manifests.prune_versions(run.out, run.cfg.keep_versions, run.cfg.keep_recent_hours * 3600)


def remove_staging(run: BuildPlan) -> None:
    fs, staging = storage.filesystem(run.staging)
    if fs.exists(staging):
        fs.rm(staging, recursive=True)


def unpublished_version(run: BuildPlan) -> dict | None:
    """The manifest of a version that a run killed while publishing had written (same input, encoding and
    settings) but not made current: the rerun publishes it instead of building it again."""
    newest = run.published["version"] if run.published else 0
    for version in sorted(manifests.version_folders(run.out), reverse=True):
        folder = storage.join(run.out, manifests.version_name(version))
        if version <= newest:
            break
        if storage.exists(storage.join(folder, manifests.MANIFEST)):
            manifest = manifests.read_manifest(folder)
            if manifest.get("build_fingerprint") == run.fingerprint:
                manifest.pop("base")
                return manifest
    return None


def check_documents(run: BuildPlan, docs: int, rejected: dict[str, int]) -> None:
    """A run without one valid document publishes nothing (it would replace the index with an empty one)."""
    if docs == 0:
        raise InputError(f"{storage.redact_url(run.cfg.input)}: no valid documents ({sum(rejected.values())} rows "
                         f"rejected: {rejected}, see {storage.redact_url(run.rejects)}); nothing published")


def check_nothing_lost(run: BuildPlan, totals: Counter, shard_counts: Counter) -> None:
    """Every valid document the encode step wrote is in a shard or rejected as a duplicate id; else storage
    lost staging parts in between (an object store restarted empty, a lifecycle rule, a manual delete).

    A resumed run's totals count every part, so also the copies of a row that a killed run and its rerun
    both wrote; a single run's totals count each row once (a retried batch rewrites its own part).
    """
    copies = shard_counts["copies"] if run.resumed else 0
    assembled = shard_counts["docs"] + shard_counts["rejected:duplicate id"] + copies
    if assembled != totals["docs"]:
        raise StorageLostDataError(
            f"{storage.redact_url(run.parts)}: the encode step wrote {totals['docs']} valid documents there, but "
            f"{assembled} were found when writing shards; storage lost staging parts, nothing was published. "
            "Rerun the job: finished parts are kept and only the missing rows are encoded again")


def check_shrink(run: BuildPlan, docs: int) -> None:
    """Refuse a version that keeps fewer than ``MIN_KEPT_FRACTION`` of the published version's documents,
    unless ``allow_shrink``: a wrong input or column must not silently replace a whole index."""
    published = run.published
    current = (published or {}).get("counts", {}).get("docs", 0)
    if published and not run.cfg.allow_shrink and docs < MIN_KEPT_FRACTION * current:
        raise ShrinkError(
            f"{storage.redact_url(run.out)}: the new version would hold {docs} documents, the published version "
            f"{published['version']} holds {current}; nothing published. If that is intended, rerun with "
            "--allow-shrink (allow_shrink: true)")


def assemble_version(run: BuildPlan, totals: Counter) -> tuple[dict, Counter]:
    """Index parameters (from a sample), then the shards; returns the version's manifest and the counts."""
    if totals["docs"] and not parquet_parts_exist(run.parts):
        check_nothing_lost(run, totals, Counter())
    rejected = reject_counts(totals)
    if rejected:
        move_rejects(run)
    check_rejects(run, rejected)  # strict: fail before the shards are written (duplicates are checked below)
    if totals["docs"] == 0:
        check_documents(run, 0, rejected)
    check_shrink(run, totals["docs"])  # before the shards are written; again after, when duplicates are known
    sample = training_sample(run, totals["rows"])
    params = run.method.index_params(run.cfg, sample, totals["rows"], run.dim)
    template = run.method.template(run.cfg, params, run.dim, sample)
    manifest = version_manifest(run, params)
    shards, shard_counts = assemble(run, manifest, totals["docs"], template)
    check_nothing_lost(run, totals, shard_counts)
    rejected = reject_counts(totals + shard_counts)
    check_rejects(run, rejected)
    check_documents(run, shard_counts["docs"], rejected)
    check_shrink(run, shard_counts["docs"])
    counts = {
        "docs_in": totals["docs"] + sum(reject_counts(totals).values()),
        "docs": shard_counts["docs"],
        "rows": shard_counts["rows"],
        "rejected": sum(rejected.values()),
        "rejects_by_reason": rejected,
        "embedded": shard_counts["embedded"],
        "carried_over": shard_counts["docs"] - shard_counts["embedded"],
        "redone": redone_docs(run, totals, shard_counts),
    }
    manifest.update(shards=shards, counts=counts, rejects="rejects" if rejected else None)
    return manifest, shard_counts


def build_index(config: IndexJobConfig) -> IndexSummary:
    """Run the whole indexing job for ``config`` and publish a new index version; returns its summary."""
    cfg = config.validate()
    started = time.perf_counter()
    files = check_locations(cfg)
    with held_lease(cfg.output.rstrip("/"), cfg.lease_seconds, cfg.lease_wait_seconds) as lease:
        ensure_ray()
        configure_ray_data(cfg)
        run = plan(cfg, files, after_version=lease.avoid_version)
        if run.unchanged:  # a run killed after publishing may have left the staging folder
            remove_staging(run)
            return manifest_summary(run, run.published, time.perf_counter() - started, published=False)
        if finished := unpublished_version(run):
            publish(run, finished, lease)
            return manifest_summary(run, finished, time.perf_counter() - started, published=True)
        lease.record_version(run.version)
        totals, encode_seconds = encode(run)
        if run.resumed:  # the counts must include the parts a killed run wrote
            totals = tally_parts(run)
        manifest, shard_counts = assemble_version(run, totals)
        publish(run, manifest, lease)
    counts = manifest["counts"]
    return IndexSummary(
        url=storage.redact_url(run.out),
        version=run.version,
        docs_in=counts["docs_in"],
        embedded=counts["embedded"],
        carried_over=counts["carried_over"],
        rejected=counts["rejected"],
        rejects_by_reason=counts["rejects_by_reason"],
        rejects_url=run.rejects if counts["rejected"] else None,
        shards=len(manifest["shards"]),
        rows=counts["rows"],
        bytes_per_doc=sum(s["bytes"] for s in manifest["shards"]) / max(1, counts["docs"]),
        seconds=time.perf_counter() - started,
        encode_seconds=encode_seconds,
        truncated=shard_counts["truncated"],
        redone=counts["redone"],
    )


def manifest_summary(run: BuildPlan, manifest: dict, seconds: float, published: bool) -> IndexSummary:
    """The summary of a run that encoded nothing: the version in ``manifest`` already indexes this input
    (``published``: this run made it current, as a run killed while publishing could not)."""
    counts = manifest["counts"]
    return IndexSummary(
        url=storage.redact_url(run.out), version=manifest["version"], docs_in=counts["docs_in"],
        embedded=0, carried_over=counts["docs"], rejected=counts["rejected"],
        rejects_by_reason=counts["rejects_by_reason"], rejects_url=None, shards=len(manifest["shards"]),
        rows=counts["rows"], bytes_per_doc=sum(s["bytes"] for s in manifest["shards"]) / max(1, counts["docs"]),
        seconds=seconds, encode_seconds=0.0, published=published,
    )
