"""The multi-node fixture is a real cluster: separate raylets, each with its own object store."""

from __future__ import annotations

import ray


def test_cluster_has_three_nodes_with_their_own_object_stores(multinode_cluster):
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 3
    assert len({n["ObjectStoreSocketName"] for n in nodes}) == 3
    assert len({n["NodeManagerPort"] for n in nodes}) == 3


@ray.remote(num_cpus=0.1)
def node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def test_work_pinned_to_a_worker_node_runs_there_and_a_removed_node_is_seen_dead(multinode_cluster):
    from local_cluster import add_worker_node, node_named

    worker = node_named(multinode_cluster, "node-1")
    assert ray.get(node_id.options(resources={"node-1": 0.01}).remote()) == worker.node_id
    multinode_cluster.remove_node(worker)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert worker.node_id not in alive
    add_worker_node(multinode_cluster, "node-1")
    assert len([n for n in ray.nodes() if n["Alive"]]) == 3
