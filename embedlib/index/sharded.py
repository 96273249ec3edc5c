"""``ShardedIndex``: search a published index; fans out over shards (in process, or Ray actors when large).

``search`` returns a ``SearchResult``: ``scores`` float32 ``(n, k)`` exact similarities (cosine for int8/float,
``-hamming`` for binary, the float query's cosine with the ``±1`` codes for a centred binary index), best first,
and the matching ``ids``. When an index holds fewer than ``k`` rows the missing places are score ``-inf`` and id
``None``.

How shards are loaded and queries answered is the index method's (``embedlib.index.methods``): a DiffRetriever
index is searched the same way, its scores MaxSim (``mode="dense"``), sparse dot products (``"sparse"``) or
the hybrid of both (``"hybrid"``, the default), normalised over the candidates of all shards together.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import ray

from embedlib import storage
from embedlib.encoding.formats import binary_queries, output_dtype, output_width
from embedlib.errors import UserError
from embedlib.index.manifest import read_manifest
from embedlib.index.methods import manifest_method
from embedlib.search.results import SearchResult

if TYPE_CHECKING:
    from embedlib.encoding.encoder import Encoder

RAY_THRESHOLD_ROWS = 5_000_000  # above this many rows, shards are served by Ray actors
# A served shard mostly holds memory and answers bursts: it reserves little CPU, so that builds on the same
# nodes can still schedule Ray Data's shuffle tasks (which ask for a whole CPU each).
SHARD_ACTOR_CPUS = 0.1


class IndexMismatchError(UserError, ValueError):
    """Queries made by another model, quantization or width than the index; the message says which."""


def load_shard(base: str, entry: dict, manifest: dict):
    """One shard of ``manifest`` in memory, as its index method loads it."""
    return manifest_method(manifest).load_shard(base, entry, manifest)


@ray.remote(num_cpus=SHARD_ACTOR_CPUS)
class ShardActor:
    """A shard served by a Ray actor (for indexes too large for one process)."""

    def __init__(self, base: str, entry: dict, manifest: dict):
        self.shard = load_shard(base, entry, manifest)

    def call(self, method: str, *args):
        """``shard.<method>(*args)``: the actor answers whatever its shard class answers."""
        return getattr(self.shard, method)(*args)


class ShardedIndex:
    """A published index opened for search; see the module docstring for what ``search`` returns."""

    def __init__(self, manifest: dict, shards: list, encoder: Encoder | None = None, remote: bool = False):
        self.manifest = manifest
        self.shards = shards
        self.remote = remote
        self._encoder = encoder

    @classmethod
    def open(
        cls,
        url: str | os.PathLike,
        model: str | os.PathLike | Encoder | None = None,
        use_ray: bool | None = None,
    ) -> ShardedIndex:
        """Open the current version at an index root (or a specific ``vNNNNNN`` folder / manifest file).

        ``model`` overrides where the query encoder is loaded from (it must have the index's weights).
        ``use_ray``: serve shards from Ray actors; by default only for indexes over ``RAY_THRESHOLD_ROWS``.
        """
        manifest = read_manifest(str(url))
        rows = sum(s["rows"] for s in manifest["shards"])
        remote = rows > RAY_THRESHOLD_ROWS if use_ray is None else use_ray
        if remote:
            shards = [ShardActor.remote(manifest["base"], entry, manifest) for entry in manifest["shards"]]
        else:
            shards = [load_shard(manifest["base"], entry, manifest) for entry in manifest["shards"]]
        index = cls(manifest, shards, remote=remote)
        if model is not None:
            index.set_encoder(model if hasattr(model, "weights_hash") else index.load_encoder(str(model)))
        return index

    @property
    def method(self) -> str:
        return manifest_method(self.manifest).name

    @property
    def location(self) -> str:
        """Where the open version is, as messages show it (credentials redacted)."""
        return storage.redact_url(self.manifest["base"])

    def load_encoder(self, path_or_url: str):
        """The query encoder for this index's method, loaded from ``path_or_url``."""
        return manifest_method(self.manifest).query_encoder(path_or_url, self.manifest)

    def call_shards(self, method: str, *args) -> list:
        """``method(*args)`` on every shard, in shard order."""
        if self.remote:
            return ray.get([shard.call.remote(method, *args) for shard in self.shards])
        return [getattr(shard, method)(*args) for shard in self.shards]

    @property
    def quantization(self) -> str:
        return self.manifest["quantization"]

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def __len__(self) -> int:
        return sum(s["rows"] for s in self.manifest["shards"])

    def check_compatible(
        self, weights_hash: str | None = None, quantization: str | None = None, dim: int | None = None
    ) -> None:
        """Refuse (``IndexMismatchError``) queries made by another model, quantization or width."""
        model = self.manifest["model"]
        if weights_hash is not None and weights_hash != model["weights_hash"]:
            raise IndexMismatchError(
                f"index {self.location} was built with model {model['source']} (weights "
                f"{model['weights_hash'][:12]}), queries come from weights {weights_hash[:12]}"
            )
        if quantization is not None and quantization != self.quantization:
            raise IndexMismatchError(
                f"index {self.location} holds {self.quantization} vectors, queries are {quantization}"
            )
        if dim is not None and dim != self.dim:
            raise IndexMismatchError(
                f"index {self.location} has dim {self.dim}, queries have dim {dim}"
            )

    def set_encoder(self, encoder) -> None:
        """Use ``encoder`` (an ``Encoder``, or a ``DiffRetrieverEncoder`` for DiffRetriever indexes) for queries."""
        self.check_compatible(weights_hash=encoder.weights_hash)
        self._encoder = encoder

    @property
    def encoder(self):
        """The manifest's model (loaded on first use and checked against the manifest's weight hash)."""
        if self._encoder is None:
            self.set_encoder(self.load_encoder(self.manifest["model"]["source"]))
        return self._encoder

    @property
    def binary_centre(self) -> np.ndarray | None:
        """A centred binary index's centre (its queries are float ``x - centre``); None otherwise."""
        centre = self.manifest.get("binary_centre")
        return None if centre is None else np.asarray(centre, dtype=np.float32)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Texts -> query vectors in the index's stored form (float ``x - centre`` for a centred binary index)."""
        centre = self.binary_centre
        if centre is not None:
            return binary_queries(self.encoder.encode(list(texts), quantization="float", dim=self.dim), centre)
        return self.encoder.encode(list(texts), quantization=self.quantization, dim=self.dim)

    def check_vectors(self, queries: np.ndarray) -> np.ndarray:
        """Query vectors must have the index's dtype (its quantization) and width; a centred binary index takes
        float queries (``encode_queries``), centred on ``binary_centre``."""
        queries = np.asarray(queries)
        if queries.ndim == 1:
            queries = queries[None, :]
        centred = self.binary_centre is not None
        float_queries = self.quantization == "float" or centred
        expected = np.dtype(np.float32) if float_queries else output_dtype(self.quantization)
        width = self.dim if float_queries else output_width(self.dim, self.quantization)
        kind = "float32 (centred on the manifest's binary_centre)" if centred else {
            "int8": "int8", "binary": "uint8 (packed binary)", "float": "float32"}[self.quantization]
        if (
            queries.ndim != 2
            or queries.shape[1] != width
            or (queries.dtype != expected and not (float_queries and queries.dtype.kind == "f"))
        ):
            raise IndexMismatchError(
                f"index {self.location} is {self.quantization} with dim {self.dim}: query vectors must be "
                f"{kind} with {width} columns, got {queries.dtype} with shape {queries.shape}"
            )
        return queries

    def search(
        self,
        queries: Sequence[str] | np.ndarray,
        k: int,
        nprobe: int | None = None,
        ef_search: int | None = None,
        **options,
    ) -> SearchResult:
        """Top-``k`` scores and ids per query, best first (texts are encoded with the manifest's model).

        ``nprobe``/``ef_search`` tune IVF/HNSW dense indexes; a DiffRetriever index takes ``mode``, ``k_query``,
        ``dense_weight`` and ``candidates`` instead (an option the index's method does not use is an error).
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        options |= {name: value for name, value in (("nprobe", nprobe), ("ef_search", ef_search)) if value}
        return manifest_method(self.manifest).search(self, queries, k, **options)

    def search_representative(self, queries, k: int, **options) -> SearchResult:
        """DiffRetriever search (texts or ``RepresentativeTokens``; ``mode`` dense, sparse or hybrid)."""
        if not manifest_method(self.manifest).multi_vector:
            raise IndexMismatchError(f"index {self.location} is a {self.method} index, not diffretriever")
        return self.search(queries, k, **options)
