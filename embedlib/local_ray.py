"""Settings for a Ray that embedlib starts itself: a local run, and the tests' and benches' clusters.

Ray keeps at most ``num_workers_soft_limit`` idle worker processes per node; the default is one per CPU. Ray
Data runs its shuffle reduce tasks in a worker pool of their own (the tasks carry their own environment). On a
node with few CPUs, every join, groupby and keyed repartition of the index build therefore stops idle workers
and starts new ones. On 2 CPUs a hash repartition of 40 rows took 4–6 s that way, and 0.15 s once both pools
could stay. A cluster started with ``ray start`` reads the same setting from ``RAY_num_workers_soft_limit`` in
its environment (README, "Clusters").
"""

from __future__ import annotations

import os

IDLE_WORKERS_ENV = "RAY_num_workers_soft_limit"
MIN_IDLE_WORKERS = 8


def keep_idle_workers() -> None:
    """Let a Ray started after this call (by this process or its children) keep ``MIN_IDLE_WORKERS`` idle
    workers per node, or one per core where this machine has more; a value already in the environment wins."""
    os.environ.setdefault(IDLE_WORKERS_ENV, str(max(MIN_IDLE_WORKERS, os.cpu_count() or 1)))
