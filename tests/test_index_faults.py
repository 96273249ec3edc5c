"""The streaming build on a real 3-node Ray cluster under faults: a lost encoder node, a killed encoder actor,
an S3 endpoint outage, and a pipeline that can no longer progress.

Faults are injected at events of the build (finished parts on storage), not after fixed sleeps. Batches are
small (many parts), so that encoding lasts long enough to inject faults while it runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from conftest import WAIT_S, all_ids, cranfield_rows, index_config, jsonl_bytes, wait_for
from local_cluster import actor_restarts, add_worker_node, live_actors, node_named

from embedlib import storage
from embedlib.errors import UserError, one_line
from embedlib.index import build_index
from embedlib.index.stall import PipelineStalledError

pytestmark = pytest.mark.multinode

ENCODER = "EncodeActor"


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models["bert"]


def staged_parts(output: str) -> int:
    """Parts the encode step has written so far under the index's staging folder."""
    fs, path = storage.filesystem(storage.join(output, "_staging"))
    return sum(name.endswith(".parquet") for name in fs.find(path)) if fs.exists(path) else 0


def build_in_thread(cfg) -> tuple[threading.Thread, dict, threading.Event]:
    result, done = {}, threading.Event()

    def run():
        try:
            result["summary"] = build_index(cfg)
        except BaseException as err:  # noqa: BLE001 - re-raised by the test
            result["error"] = err
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result, done


def test_build_survives_killed_actor_lost_node_and_s3_outage(multinode_cluster, s3_proxy, s3_bucket, model):
    """One build, three faults while it encodes: an encoder actor's process is killed, the node running the
    encoders is removed (and a replacement joins), the S3 endpoint refuses connections for 3 s. The job
    finishes without a rerun, every id once, and the summary counts the documents encoded again."""
    rows = cranfield_rows(1400)
    storage.write_bytes_atomic(f"{s3_bucket}/corpus/part-0.jsonl", jsonl_bytes(rows))
    output = f"{s3_bucket}/index"
    batches = len(rows) // 8
    cfg = index_config(f"{s3_bucket}/corpus", output, model, batch_rows=8, actors=2, cpus_per_actor=0.25,
                       actor_resources={"node-1": 0.4}, max_actor_restarts=3, max_task_retries=3)
    restarts_before = actor_restarts(ENCODER)
    thread, result, done = build_in_thread(cfg)

    wait_for(lambda: staged_parts(output) >= batches // 10, "10% of the parts", done)
    victim = live_actors(ENCODER)[0]
    os.kill(victim["Pid"], signal.SIGKILL)

    wait_for(lambda: staged_parts(output) >= batches // 3, "a third of the parts", done)
    multinode_cluster.remove_node(node_named(multinode_cluster, "node-1"))
    add_worker_node(multinode_cluster, "node-1")

    wait_for(lambda: staged_parts(output) >= 2 * batches // 3, "two thirds of the parts", done)
    s3_proxy.down()
    time.sleep(3)  # the outage's length
    s3_proxy.up()

    thread.join(WAIT_S)
    assert done.is_set(), "the build hangs"
    assert "error" not in result, result.get("error")
    summary = result["summary"]
    assert (summary.published, summary.docs_in, summary.rejected) == (True, len(rows), 0)
    assert sorted(all_ids(output)) == sorted(r["_id"] for r in rows)
    assert actor_restarts(ENCODER) - restarts_before >= 2  # the killed actor and the lost node's actors
    assert 0 < summary.redone < len(rows)
    assert f"{summary.redone} docs encoded again" in str(summary)


def test_stalled_pipeline_fails_with_one_line_after_stall_timeout(multinode_cluster, tmp_path, model):
    """The only node the encoders may run on is lost and none replaces it: Ray Data would wait for the actors
    forever; the build fails after ``stall_timeout_s`` with one line that says what happened."""
    rows = cranfield_rows(1400)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(jsonl_bytes(rows))
    output = str(tmp_path / "index")
    cfg = index_config(str(corpus), output, model, batch_rows=8, actors=1, cpus_per_actor=0.25,
                       actor_resources={"node-0": 0.4}, stall_timeout_s=20)  # > actor start-up
    lost = {}

    def lose_node_once_encoding():
        wait_for(lambda: staged_parts(output) >= 1, "the first part")
        multinode_cluster.remove_node(node_named(multinode_cluster, "node-0"))
        lost["at"] = time.time()

    threading.Thread(target=lose_node_once_encoding, daemon=True).start()
    with pytest.raises(PipelineStalledError) as raised:
        build_index(cfg)
    assert isinstance(raised.value, UserError)
    assert "at" in lost and time.time() - lost["at"] < 20 + 30  # failed within the bound, not forever
    message = one_line(raised.value)
    assert message == str(raised.value) and "no batch finished for 20 s (stall_timeout_s)" in message
    assert not storage.exists(f"{output}/manifest.json")
    add_worker_node(multinode_cluster, "node-0")  # the cluster as it was, for the module's next tests


