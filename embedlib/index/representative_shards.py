"""DiffRetriever shards: a multi-vector FAISS index and an integer inverted index per shard.

Files per shard: ``shard-NNNNN.parquet`` (ids, the K_p vectors flattened, the sparse vector; also the
carry-over source of incremental runs, as for dense shards), ``shard-NNNNN.faiss`` (inner-product index over
every mask-position vector) and ``shard-NNNNN.postings.npz`` (term -> document postings, weights quantized to
integers as PromptReps does). Dense and sparse scores are raw (MaxSim, dot product), so shards merge by score;
hybrid scores are normalised over the candidates of all shards together (``ShardedIndex`` does that).
"""

from __future__ import annotations

import io

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from embedlib import storage
from embedlib.encoding.representative_tokens import RepresentativeTokens
from embedlib.index.columns import column_matrix, sparse_matrix
from embedlib.index.manifest import check_shard_count, check_vector_width
from embedlib.index.shard_files import read_checked
from embedlib.search.hybrid import Candidates, DiffRetrieverIndex, fuse_candidates
from embedlib.search.multivector import DEFAULT_FACTORY, MultiVectorIndex
from embedlib.search.results import SearchResult, named_per_row
from embedlib.search.sparse import SparseIndex

DEFAULT_PARAMS = {"factory": DEFAULT_FACTORY, "sparse_scale": 100.0, "candidates": 100}
SPARSE_COLUMNS = ["sparse_ids", "sparse_weights"]


def vector_dtype(manifest: dict) -> np.dtype:
    """How the shards store the K_p vectors: float16 (older indexes: float32, which their manifests do not name)."""
    return np.dtype(manifest.get("vector_dtype", "float32"))


def shard_tokens(table: pa.Table, k: int, dim: int, vocab_size: int, dtype: np.dtype) -> RepresentativeTokens:
    """A shard table's documents as representative tokens (``vector`` holds ``k * dim`` values per row)."""
    dense = column_matrix(table.column("vector"), dtype).astype(np.float32).reshape(table.num_rows, k, dim)
    sparse = sparse_matrix(table.column("sparse_ids"), table.column("sparse_weights"), vocab_size)
    return RepresentativeTokens(dense=list(dense), sparse=sparse, k=k)


def shard_index_files(table: pa.Table, manifest: dict) -> dict[str, bytes]:
    """The shard's ``.faiss`` and ``.postings.npz`` files."""
    k, dim, vocab_size, params = manifest["k_passage"], manifest["dim"], manifest["vocab_size"], manifest["index"]["params"]
    tokens = shard_tokens(table, k, dim, vocab_size, vector_dtype(manifest))
    if table.num_rows:
        index = DiffRetrieverIndex.build(tokens, factory=params["factory"], scale=params["sparse_scale"])
        dense, sparse = index.dense.faiss, index.sparse
    else:
        dense = faiss.index_factory(dim, params["factory"], faiss.METRIC_INNER_PRODUCT)
        sparse = SparseIndex(sp.csr_matrix((0, vocab_size), dtype=np.float32), params["sparse_scale"])
    return {"faiss": faiss.serialize_index(dense).tobytes(), "postings.npz": sparse.postings_bytes()}


class RepresentativeShard:
    """One DiffRetriever shard in memory."""

    def __init__(self, ids: list[str], index: DiffRetrieverIndex):
        self.ids, self.index = ids, index

    @classmethod
    def load(cls, base: str, entry: dict, manifest: dict) -> RepresentativeShard:
        """Read one shard of ``manifest``, checking every file against its checksum."""
        name, k, dim = entry["name"], manifest["k_passage"], manifest["dim"]
        url = storage.join(base, f"{name}.parquet")
        table = pq.read_table(io.BytesIO(read_checked(url, entry["parquet_sha256"])), columns=["id", "vector"])
        check_shard_count(url, table.num_rows, entry["rows"])
        dtype = vector_dtype(manifest)
        check_vector_width(url, table.column("vector"), k * dim * dtype.itemsize, f"k_passage {k} x dim {dim} {dtype}")
        vectors = column_matrix(table.column("vector"), dtype).reshape(-1, dim)
        offsets = np.arange(0, len(vectors) + 1, k, dtype=np.int64)
        params = manifest["index"]["params"]
        faiss_url = storage.join(base, f"{name}.faiss")
        faiss_index = faiss.deserialize_index(np.frombuffer(read_checked(faiss_url, entry["faiss_sha256"]), np.uint8))
        check_shard_count(faiss_url, faiss_index.ntotal, len(vectors), "vectors")
        dense = MultiVectorIndex.from_arrays(vectors, offsets, faiss_index, params["factory"])
        postings_url = storage.join(base, f"{name}.postings.npz")
        postings = sp.load_npz(io.BytesIO(read_checked(postings_url, entry["postings_sha256"])))
        check_shard_count(postings_url, postings.shape[0], entry["rows"], "documents")
        sparse = SparseIndex.from_postings(postings, params["sparse_scale"])
        return cls(table.column("id").to_pylist(), DiffRetrieverIndex(dense, sparse))

    def search(self, tokens: RepresentativeTokens, k: int, mode: str) -> SearchResult:
        """Top-``k`` raw dense (MaxSim) or sparse scores and ids (``-inf`` / ``None`` fill short rows)."""
        if len(self.ids) == 0:
            return SearchResult.empty(len(tokens), k)
        found = self.index.search(tokens, min(k, len(self.ids)), mode=mode)
        scores = np.where(found.positions >= 0, found.scores, -np.inf).astype(np.float32)
        return SearchResult(positions=found.positions, scores=scores).named(self.ids)

    def hybrid_candidates(
        self, tokens: RepresentativeTokens, candidates: int
    ) -> list[tuple[Candidates, list[str]]]:
        """Per query, this shard's hybrid candidates with raw scores, and their ids."""
        if len(self.ids) == 0:
            empty = np.zeros(0, np.float32)
            return [(Candidates(np.zeros(0, np.int64), empty, empty), []) for _ in range(len(tokens))]
        found = self.index.hybrid_candidates(tokens.dense, tokens.sparse, min(candidates, len(self.ids)))
        return [(c, [self.ids[p] for p in c.positions]) for c in found]


def fuse_shard_candidates(
    per_shard: list[list[tuple[Candidates, list[str]]]], n: int, k: int, dense_weight: float
) -> SearchResult:
    """Hybrid top-``k`` over the candidates of all shards: normalised together, fused, ranked."""
    merged = []
    ids = []
    for row in range(n):
        parts = [shard[row] for shard in per_shard]
        dense = np.concatenate([np.zeros(0, np.float32)] + [c.dense for c, _ in parts])
        sparse = np.concatenate([np.zeros(0, np.float32)] + [c.sparse for c, _ in parts])
        merged.append(Candidates(np.arange(len(dense), dtype=np.int64), dense, sparse))
        ids.append([doc for _, shard_ids in parts for doc in shard_ids])
    fused = fuse_candidates(merged, k, dense_weight)
    return named_per_row(fused, ids)
