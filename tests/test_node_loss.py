"""Losing a worker node of the real multi-node cluster (``multinode_cluster``): served search re-places its
shards and answers as before; a 2-worker Ray Train + DeepSpeed run resumes from its latest checkpoint.

The whole training scenario, with a fault-free run to compare the final weights with and the checkpoint upload
timings, is ``bench/train_node_loss.py``; the test here checks the behaviour on a short run.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import ray
from conftest import cranfield_pair_rows, cranfield_rows, tiny_pair_values, write_jsonl
from local_cluster import add_worker_node, node_named
from train_faults import CheckpointMarkers, HoldForNodeLoss, wait_for_file

from embedlib.data import SAMPLE_DATASET
from embedlib.errors import UserError
from embedlib.search.served import ServedIndex, ShardsUnavailableError

pytestmark = [pytest.mark.slow, pytest.mark.multinode, pytest.mark.timeout(600)]
WORKER_NODES = ("node-0", "node-1")


def worker_node_with(cluster, node_ids) -> tuple[str, object]:
    """The name and node of a worker node (not the head) that hosts one of ``node_ids``."""
    for name in WORKER_NODES:
        node = node_named(cluster, name)
        if node.node_id in node_ids:
            return name, node
    raise AssertionError(f"no worker node hosts any of {node_ids}")


@pytest.fixture(scope="module")
def index_url(multinode_cluster, tiny_models, tmp_path_factory) -> str:
    """A flat int8 index of 120 Cranfield documents in 6 shards, built on the cluster."""
    from embedlib.index import IndexJobConfig, build_index

    folder = tmp_path_factory.mktemp("served")
    corpus = write_jsonl(folder / "corpus.jsonl", cranfield_rows(120))
    output = str(folder / "index")
    build_index(IndexJobConfig(input=corpus, output=output,
                               model=str(tiny_models["pplx-embed"]), shard_size=20, show_progress=False))
    return output


@pytest.fixture(scope="module")
def served(index_url) -> ServedIndex:
    """The index served by one actor per shard (started once for the module: 6 actor processes)."""
    return ServedIndex.serve(index_url, wait_s=120)


def test_served_search_answers_the_same_after_losing_a_node(multinode_cluster, served):
    index = served
    texts = [q["text"] for q in map(json.loads, open(SAMPLE_DATASET / "queries.jsonl"))][:8]
    queries = index.encode_queries(texts)
    before = index.search(queries, k=10)
    placement = index.placement()
    assert len(set(placement)) >= 2  # spread over nodes
    name, node = worker_node_with(multinode_cluster, placement)
    lost = [i for i, n in enumerate(placement) if n == node.node_id]

    removed = time.monotonic()
    multinode_cluster.remove_node(node)
    during = index.search(queries, k=10)  # waits while the lost shards are re-placed
    recovery_s = time.monotonic() - removed
    add_worker_node(multinode_cluster, name)  # the fixture's cluster is whole again for the next test

    assert during.ids == before.ids
    np.testing.assert_array_equal(during.scores, before.scores)
    moved = index.placement()
    assert all(moved[i] != node.node_id for i in lost)
    print(f"served search: {len(lost)} of {len(placement)} shards re-placed, answered after {recovery_s:.1f} s")


def test_two_worker_training_resumes_from_its_checkpoint_after_losing_a_node(
    multinode_cluster, tiny_models, shared_data, tmp_path
):
    from embedlib.training.config import TrainConfig, from_dict
    from embedlib.training.data import write_rows
    from embedlib.training.runner import train

    write_rows(cranfield_pair_rows(shared_data, 48), str(tmp_path / "pairs.parquet"))
    cfg = from_dict(TrainConfig, tiny_pair_values(
        tiny_models["pplx-embed"], str(tmp_path / "pairs.parquet"), tmp_path, "node-loss", max_steps=4,
        deepspeed={"zero_stage": 2}, checkpoint_url=str(tmp_path / "ckpt"), checkpoint_every=2, max_failures=2,
        scaling={"num_workers": 2, "cpus_per_worker": 0.5, "placement_strategy": "STRICT_SPREAD"},
    ))
    markers = tmp_path / "markers"
    markers.mkdir()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = train(cfg, after_step=HoldForNodeLoss(markers, step=3),
                                      callbacks=[CheckpointMarkers(markers)])
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            outcome["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    for marker in ("registered-2", "held-rank0", "held-rank1"):  # both workers past step 3, step 2 saved
        wait_for_file(markers / marker, timeout_s=300)
    held = [json.loads((markers / f"held-rank{r}").read_text()) for r in (0, 1)]
    name, node = worker_node_with(multinode_cluster, {h["node_id"] for h in held})
    removed = time.time()
    multinode_cluster.remove_node(node)
    add_worker_node(multinode_cluster, name)
    thread.join(timeout=400)
    assert not thread.is_alive()
    if "error" in outcome:
        raise outcome["error"]
    history = outcome["result"].history
    assert [row["step"] for row in history] == [1, 2, 3, 4]  # the step count continues
    assert all(row["resumed_from_step"] == 2 for row in history[2:])
    # step 3 redone from the step-2 checkpoint on the same batches: the same loss as before the node was lost
    assert history[2]["loss"] == pytest.approx(held[0]["loss"], rel=1e-5)
    resumed = json.loads((markers / "resumed-rank0").read_text())
    print(f"training: resumed {resumed['time'] - removed:.1f} s after the node was removed, "
          f"{3 - history[2]['resumed_from_step']} step redone")


def test_served_search_refuses_a_partial_top_k(multinode_cluster, served):
    """Runs last in the module: it leaves shard 2 of the served index dead for good."""
    queries = served.encode_queries(["flow over a flat plate"])
    ray.kill(served.shards[2], no_restart=True)  # a shard that never comes back
    served.wait_s = 5
    with pytest.raises(ShardsUnavailableError, match=r"1 of 6 shards did not answer within 5 s \(shard-00002\)"):
        served.search(queries, k=5)
    assert issubclass(ShardsUnavailableError, UserError)
