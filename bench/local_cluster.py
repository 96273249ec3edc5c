"""A real multi-node Ray cluster on one machine, for tests and benches.

Each node is its own raylet with its own object store (``ray.cluster_utils.Cluster``), so losing a node loses its
actors and the objects only it held, as on a real cluster. CPUs are fractional-friendly: the defaults give a head
with 1 CPU and two workers with 1 CPU each on a 2-core machine; Ray schedules by these numbers, not by cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ray.cluster_utils import Cluster

MiB = 1024 * 1024


def start_local_cluster(worker_nodes: int = 2, head_cpus: float = 1, worker_cpus: float = 1,
                        object_store_mib: int = 100, worker_resources: dict | None = None) -> Cluster:
    """Head plus ``worker_nodes`` workers; each worker node also carries the custom resource ``{"node-<i>": 1}``."""
    from embedlib.local_ray import keep_idle_workers

    keep_idle_workers()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": head_cpus, "object_store_memory": object_store_mib * MiB,
                        "include_dashboard": False},
    )
    for i in range(worker_nodes):
        add_worker_node(cluster, f"node-{i}", worker_cpus, object_store_mib, worker_resources)
    cluster.wait_for_nodes()
    return cluster


def add_worker_node(cluster: Cluster, name: str, cpus: float = 1, object_store_mib: int = 100,
                    resources: dict | None = None):
    """Add one worker node carrying the custom resource ``{name: 1}`` (to pin work to it in tests)."""
    node = cluster.add_node(num_cpus=cpus, object_store_memory=object_store_mib * MiB,
                            resources={name: 1, **(resources or {})})
    cluster.wait_for_nodes()
    return node


def node_named(cluster: Cluster, name: str):
    """The live worker node that carries the custom resource ``name`` (as ``add_worker_node`` gave it)."""
    import ray

    ids = {n["NodeID"] for n in ray.nodes() if n["Alive"] and name in n["Resources"]}
    return next(node for node in cluster.worker_nodes if node.node_id in ids)


@contextmanager
def local_cluster(**kwargs) -> Iterator[Cluster]:
    """``start_local_cluster`` as a context manager that shuts the cluster down on exit."""
    cluster = start_local_cluster(**kwargs)
    try:
        yield cluster
    finally:
        cluster.shutdown()


def live_actors(class_name_part: str) -> list[dict]:
    """Alive actors of the connected cluster whose class name contains ``class_name_part``, from the GCS actor
    table: ``ActorID``, ``Pid``, ``NumRestarts``, ``Address["NodeID"]``, ... (e.g. Ray Data's pool actors:
    ``MapWorker(MapBatches(EncodeActor))``)."""
    from ray._private.state import actors

    return [a for a in actors().values() if a["State"] == "ALIVE" and class_name_part in a["ActorClassName"]]


def actor_restarts(class_name_part: str) -> int:
    """Restarts of the cluster's actors (alive or not) whose class name contains ``class_name_part``."""
    from ray._private.state import actors

    return sum(a["NumRestarts"] for a in actors().values() if class_name_part in a["ActorClassName"])
