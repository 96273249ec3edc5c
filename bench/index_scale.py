"""Pipeline cost of the streaming index build as the corpus grows, on a real S3 endpoint (moto server, loopback).

    python bench/index_scale.py                                  # 300k, 1M, 3M docs + the 1M incremental check
    python bench/index_scale.py --sizes 30000,100000 --incremental 100000 --name index_scale_small

A synthetic corpus of short documents is written as parquet parts to a bucket; each size is indexed by a fresh
driver process (``build_index`` connected to one local Ray cluster) with a tiny real-format model, so the model
is not the cost. Per size it reports the driver's peak RSS, the object store's peak use and spilled bytes
(sampled every second from Ray's memory summary by the bench's own process, not the driver) and wall time
per document. The incremental check edits 1%, deletes 0.5% and adds 0.5% of the ``--incremental`` corpus,
rebuilds, and reads every shard back.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from build_driver import driver_command, parse_result  # noqa: E402
from result_file import Result  # noqa: E402

WORDS = np.array(("index shard vector search query model token corpus storage object embed recall cluster node "
                  "actor stream batch parquet manifest version carry over encode decode diffusion mask pool "
                  "mean sign binary scale billion document text title web crawl nightly job driver memory").split())
PART_ROWS = 100_000
BUCKET = "bench-index-scale"


def doc_text(rng: np.random.Generator, n: int) -> list[str]:
    lengths = rng.integers(8, 24, n)
    picks = rng.integers(0, len(WORDS), lengths.sum())
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [" ".join(WORDS[picks[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def write_corpus(url: str, ids: list[str], texts: list[str]) -> None:
    """Parquet parts of ``PART_ROWS`` documents (``id, title, text``) under ``url``."""
    import s3fs

    fs = s3fs.S3FileSystem()
    for number, first in enumerate(range(0, len(ids), PART_ROWS)):
        table = pa.table({"id": ids[first : first + PART_ROWS], "title": [""] * len(ids[first : first + PART_ROWS]),
                          "text": texts[first : first + PART_ROWS]})
        with fs.open(f"{url.removeprefix('s3://')}/part-{number:05d}.parquet", "wb") as f:
            pq.write_table(table, f)


def corpus(size: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    return [f"doc-{i:09d}" for i in range(size)], doc_text(rng, size)


class MemorySampler(threading.Thread):
    """Samples Ray's object store use (plasma) and spilled bytes once a second."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_store = 0.0
        self.spilled = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        from ray._private.internal_api import memory_summary

        while not self.stop.is_set():
            try:
                text = memory_summary(stats_only=True)
                used = re.search(r"Plasma memory usage (\d+(?:\.\d+)?) MiB", text)
                spilled = re.search(r"Spilled (\d+(?:\.\d+)?) MiB", text)
                if used:
                    self.peak_store = max(self.peak_store, float(used.group(1)) * 2**20)
                if spilled:
                    self.spilled = max(self.spilled, float(spilled.group(1)) * 2**20)
            except Exception:  # noqa: BLE001 - a missed sample only
                pass
            self.stop.wait(1.0)


def run_build(input_url: str, output: str, model: str, args: argparse.Namespace, env: dict) -> dict:
    """One build in a fresh driver process; the object store is sampled from this process meanwhile, so the
    driver's peak RSS is the build's alone."""
    command = driver_command(input=input_url, output=output, model=model, shard_size=args.shard_size,
                             batch_rows=args.batch_rows)
    sampler = MemorySampler()
    sampler.start()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    sampler.stop.set()
    sampler.join()
    figures = parse_result(done.stdout)
    if done.returncode or figures is None:
        raise SystemExit(f"build failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return figures | {"object_store_peak_bytes": int(sampler.peak_store), "spilled_bytes": int(sampler.spilled)}


def read_back_ids(output: str) -> list[str]:
    """Every id of the published index, read from every shard file."""
    from embedlib import storage
    from embedlib.index.manifest import read_manifest

    manifest = read_manifest(output)
    ids: list[str] = []
    for shard in manifest["shards"]:
        data = storage.read_bytes(storage.join(manifest["base"], f"{shard['name']}.parquet"))
        ids += pq.read_table(pa.BufferReader(data), columns=["id"]).column("id").to_pylist()
    return ids


def incremental(size: int, model: str, args: argparse.Namespace, env: dict, built: str | None) -> dict:
    """Edit 1%, delete 0.5%, add 0.5% of a ``size`` corpus and rebuild; check counts and every shard."""
    ids, texts = corpus(size)
    input_url = f"s3://{BUCKET}/incremental-{size}"
    output = built or f"s3://{BUCKET}/index-incremental-{size}"
    if built is None:
        write_corpus(input_url, ids, texts)
        run_build(input_url, output, model, args, env)
    rng = np.random.default_rng(1)
    order = rng.permutation(size)
    edited, deleted = order[: size // 100], order[size // 100 : size // 100 + size // 200]
    texts = list(texts)
    for i in edited:
        texts[i] = texts[i] + " edited"
    gone = set(deleted.tolist())
    kept = [i for i in range(size) if i not in gone]
    added = size // 200
    new_ids, new_texts = [f"new-{i:09d}" for i in range(added)], doc_text(rng, added)
    ids2 = [ids[i] for i in kept] + new_ids
    texts2 = [texts[i] for i in kept] + new_texts
    input2 = f"s3://{BUCKET}/incremental-{size}-v2"
    write_corpus(input2, ids2, texts2)
    figures = run_build(input2, output, model, args, env)
    found = read_back_ids(output)
    deleted_ids = {ids[i] for i in deleted}
    return {
        "documents": size, "edited": len(edited), "deleted": len(deleted), "added": added, **figures,
        "embedded_equals_edited_plus_added": figures["embedded"] == len(edited) + added,
        "deleted_absent": not deleted_ids & set(found),
        "every_id_exactly_once": len(found) == len(set(found)) and set(found) == set(ids2),
        "ids_read_back": len(found),
    }


def start_environment(object_store_mb: int, prefix: str = "index-scale-") -> tuple[object, str, dict]:
    """A moto S3 server with ``BUCKET`` (its endpoint and credentials in ``os.environ``), a tiny real-format
    model and a local Ray with an object store of ``object_store_mb``; returns (server, model path, the
    environment for build processes, with ``RAY_ADDRESS``)."""
    import tempfile

    import ray
    from s3_endpoint import start_s3_endpoint

    from embedlib.local_ray import keep_idle_workers
    from embedlib.models.tiny import make_tiny_checkpoint

    server = start_s3_endpoint(BUCKET)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    model = str(make_tiny_checkpoint(work / "tiny-bert", "bert"))
    keep_idle_workers()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             object_store_memory=object_store_mb * 2**20, _temp_dir=str(work / "ray"))
    return server, model, dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="300000,1000000,3000000")
    parser.add_argument("--incremental", type=int, default=1_000_000, help="0: skip the incremental check")
    parser.add_argument("--shard-size", type=int, default=500_000)
    parser.add_argument("--batch-rows", type=int, default=8192)
    parser.add_argument("--object-store-mb", type=int, default=2000)
    parser.add_argument("--name", default="index_scale")
    args = parser.parse_args()
    result = Result(args.name)
    import ray

    server, model, env = start_environment(args.object_store_mb)

    points: list[dict] = []
    settings = {
        "model": "tiny random BERT (real format, embedlib.models.tiny)", "endpoint": "moto server (S3 over HTTP)",
        "object_store_memory_bytes": args.object_store_mb * 2**20, "shard_size": args.shard_size,
        "batch_rows": args.batch_rows,
    }
    for size in [int(s) for s in args.sizes.split(",") if s]:
        ids, texts = corpus(size)
        input_url = f"s3://{BUCKET}/corpus-{size}"
        write_corpus(input_url, ids, texts)
        del ids, texts
        figures = run_build(input_url, f"s3://{BUCKET}/index-{size}", model, args, env)
        points.append({"documents": size, **figures})
        print(json.dumps(points[-1]), flush=True)
        result.write(settings | {"points": points, "complete": False})  # a long run keeps what it measured

    built = next((f"s3://{BUCKET}/index-{p['documents']}" for p in points if p["documents"] == args.incremental), None)
    check = incremental(args.incremental, model, args, env, built) if args.incremental else None
    if check:
        print(json.dumps(check), flush=True)
    first, last = points[0], points[-1]
    figures = settings | {
        "points": points, "incremental": check, "complete": True,
        "driver_rss_ratio_last_vs_first": round(last["driver_peak_rss_bytes"] / first["driver_peak_rss_bytes"], 3),
        "time_per_doc_ratio_last_vs_first": round(last["us_per_doc"] / first["us_per_doc"], 3),
    }
    result.write(figures)
    print(json.dumps({k: v for k, v in figures.items() if k not in ("points", "incremental")}, indent=2))
    ray.shutdown()
    server.stop()


if __name__ == "__main__":
    main()
