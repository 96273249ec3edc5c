"""Serving a published index from Ray actors spread over the cluster's nodes, so that it survives losing one.

Each shard is one actor, placed with Ray's ``SPREAD`` strategy and restarted without limit
(``max_restarts=-1``): when its node is lost, Ray starts it on a live node, where it loads its shard again from
storage (checksums checked, as ``ShardedIndex.open`` does). Answers after recovery are therefore identical.

A search needs every shard: it waits up to ``wait_s`` seconds for shards that are being re-placed and then
raises :class:`ShardsUnavailableError` naming them. It never returns a top-k over only some shards.
"""

from __future__ import annotations

import os
import time

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from embedlib.errors import UserError
from embedlib.index.manifest import read_manifest
from embedlib.index.sharded import SHARD_ACTOR_CPUS, ShardedIndex, load_shard

DEFAULT_WAIT_S = 60.0  # how long a search waits for shards that are being re-placed after a node loss
RETRY_PAUSE_S = 0.2  # between calls to a shard whose actor is down


class ShardsUnavailableError(UserError, TimeoutError):
    """Some shards did not answer within the search's wait (their node was lost and they are not back yet)."""


@ray.remote(num_cpus=SHARD_ACTOR_CPUS, max_restarts=-1, max_task_retries=0, scheduling_strategy="SPREAD")
class ServedShard:
    """One shard, loaded from storage when the actor starts (again on a live node after its node is lost)."""

    def __init__(self, base: str, entry: dict, manifest: dict):
        self.shard = load_shard(base, entry, manifest)

    def call(self, method: str, *args):
        """``shard.<method>(*args)``: the actor answers whatever its shard class answers."""
        return getattr(self.shard, method)(*args)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


class ServedIndex(ShardedIndex):
    """A ``ShardedIndex`` whose shards are ``ServedShard`` actors; ``search`` waits for every shard (module doc)."""

    wait_s: float = DEFAULT_WAIT_S

    @classmethod
    def serve(
        cls, url: str | os.PathLike, model=None, wait_s: float = DEFAULT_WAIT_S
    ) -> ServedIndex:
        """Start one actor per shard of the current version at ``url``; returns once every shard is loaded.

        ``model`` as in ``ShardedIndex.open``; ``wait_s``: how long a search waits for shards being re-placed.
        """
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        manifest = read_manifest(str(url))
        shards = [ServedShard.remote(manifest["base"], entry, manifest) for entry in manifest["shards"]]
        index = cls(manifest, shards, remote=True)
        index.wait_s = wait_s
        ray.get([shard.node_id.remote() for shard in shards])  # loaded: a load error surfaces here
        if model is not None:
            index.set_encoder(model if hasattr(model, "weights_hash") else index.load_encoder(str(model)))
        return index

    @classmethod
    def open(cls, url: str | os.PathLike, model=None, use_ray: bool | None = None) -> ServedIndex:
        """``serve`` with the default wait: a served index always runs its shards on restartable actors."""
        return cls.serve(url, model)

    def placement(self) -> list[str]:
        """The node id each shard is served from, in shard order (waits for shards being re-placed)."""
        return self.call_shard_actors("node_id")

    def call_shards(self, method: str, *args) -> list:
        """``method(*args)`` on every shard, in shard order, waiting up to ``wait_s`` for shards that are down."""
        return self.call_shard_actors("call", method, *args)

    def call_shard_actors(self, actor_method: str, *args) -> list:
        deadline = time.monotonic() + self.wait_s
        pending = {getattr(shard, actor_method).remote(*args): i for i, shard in enumerate(self.shards)}
        results: dict[int, object] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise self.unavailable(sorted(pending.values()))
            i = pending.pop(ready[0])
            try:
                results[i] = ray.get(ready[0])
            except (RayActorError, ActorUnavailableError):  # its node was lost: ask again once it is back
                if time.monotonic() + RETRY_PAUSE_S >= deadline:
                    raise self.unavailable(sorted([i, *pending.values()])) from None
                time.sleep(RETRY_PAUSE_S)
                pending[getattr(self.shards[i], actor_method).remote(*args)] = i
        return [results[i] for i in range(len(self.shards))]

    def unavailable(self, positions: list[int]) -> ShardsUnavailableError:
        names = ", ".join(self.manifest["shards"][i]["name"] for i in positions)
        return ShardsUnavailableError(
            f"index {self.location}: {len(positions)} of {len(self.shards)} shards did not answer within "
            f"{self.wait_s:g} s ({names}); their node was lost and they are not served again yet. "
            "No partial results are returned: retry, or serve with a longer wait_s"
        )
