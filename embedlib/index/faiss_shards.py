"""FAISS indexes for shards: int8 via ``SQ8_direct_signed``, binary via ``IndexBinary*``, float via flat/IVF-PQ/HNSW.

Scores are always the exact similarity of ``embedlib.encoding.formats.similarity`` (cosine for int8 and float,
``-hamming`` for binary; for the float queries of a centred binary index, their cosine with the documents' ``±1``
codes): FAISS proposes candidates and they are re-scored from the stored vectors. Flat int8 and flat centred
binary are scanned exhaustively (int8 vectors are not normalized, so FAISS' inner product is not their cosine;
FAISS has no float-against-bits search). For IVF and HNSW over int8, FAISS holds each vector unit-normalized and
re-quantized to int8 (``unit_scale``), so its inner product approximates the cosine and the candidates it proposes
are the right ones.
"""

from __future__ import annotations

import io
import math

import faiss
import numpy as np
import pyarrow.parquet as pq

from embedlib import storage
from embedlib.encoding.formats import normalized, output_dtype, output_width, similarity
from embedlib.index.columns import column_matrix
from embedlib.index.manifest import check_shard_count, check_vector_width
from embedlib.index.shard_files import read_checked
from embedlib.search.results import SearchResult, top_k_candidates

SCAN_ROWS = 65_536  # rows per block of the exhaustive scan


def unit_scale(sample: np.ndarray) -> float:
    """The factor that maps unit-normalized vectors onto the int8 range (0.01% of entries are clipped)."""
    top = float(np.quantile(np.abs(normalized(sample)), 0.9999)) if len(sample) else 1.0
    return 127.0 / max(top, 1e-6)


def faiss_vectors(vectors: np.ndarray, quantization: str, params: dict) -> np.ndarray:
    """What FAISS stores: int8 values (unit-normalized and re-quantized), unit-length floats, packed bits."""
    if quantization == "binary":
        return np.ascontiguousarray(vectors, dtype=np.uint8)
    if quantization == "int8":
        return np.clip(np.round(normalized(vectors) * params["unit_scale"]), -127, 127).astype(np.float32)
    return normalized(vectors)


def faiss_queries(queries: np.ndarray, quantization: str, params: dict) -> np.ndarray:
    """Queries on the scale of the stored vectors (FAISS may quantize int8-index queries like the data)."""
    if quantization == "int8":
        return normalized(queries) * params["unit_scale"]
    if quantization == "binary":
        # float queries of a centred binary index propose candidates by the Hamming distance of their signs
        if is_centred_binary(queries, quantization):
            return np.packbits(queries > 0, axis=-1)
        return np.ascontiguousarray(queries)
    return normalized(queries)


def default_params(
    index_type: str, quantization: str, width: int, sample: np.ndarray, total_rows: int, cfg
) -> dict:
    """Index parameters for a corpus of ``total_rows`` (``sample`` drawn from it); ``cfg`` fields override."""
    params: dict = {"unit_scale": unit_scale(sample)} if quantization == "int8" else {}
    if index_type == "ivf":
        # k-means needs at least as many training vectors as centroids (coarse and PQ alike).
        default_nlist = max(1, min(int(4 * math.sqrt(total_rows)), total_rows // 39 or 1))
        params["nlist"] = max(1, min(cfg.nlist or default_nlist, len(sample)))
        params["nprobe"] = cfg.nprobe
        if quantization == "float":
            params["pq_m"] = cfg.pq_m or next(
                m for m in (width // 8, width // 4, width // 2, width) if m >= 1 and width % m == 0
            )
            params["pq_nbits"] = max(1, min(8, int(math.log2(max(2, len(sample))))))
    if index_type == "hnsw":
        params["hnsw_m"] = cfg.hnsw_m
        params["ef_search"] = cfg.ef_search
    if index_type != "flat":
        params["rerank_factor"] = cfg.rerank_factor
    return params


def empty_index(quantization: str, index_type: str, dim: int, params: dict):
    """An untrained, empty index for ``dim`` dimensions."""
    ip = faiss.METRIC_INNER_PRODUCT
    sq8 = faiss.ScalarQuantizer.QT_8bit_direct_signed
    if quantization == "binary":
        if index_type == "flat":
            return faiss.IndexBinaryFlat(dim)
        if index_type == "ivf":
            return faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(dim), dim, params["nlist"])
        return faiss.IndexBinaryHNSW(dim, params["hnsw_m"])
    if quantization == "int8":
        if index_type == "flat":
            return faiss.IndexScalarQuantizer(dim, sq8, ip)
        if index_type == "ivf":
            index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, params["nlist"], sq8, ip)
            index.by_residual = False  # direct codes store the vector itself, not its residual to a centroid
            return index
        return faiss.IndexHNSWSQ(dim, sq8, params["hnsw_m"], ip)
    if index_type == "flat":
        return faiss.IndexFlatIP(dim)
    if index_type == "ivf":
        return faiss.IndexIVFPQ(
            faiss.IndexFlatIP(dim), dim, params["nlist"], params["pq_m"], params["pq_nbits"], ip
        )
    return faiss.IndexHNSWFlat(dim, params["hnsw_m"], ip)


def serialize(index) -> bytes:
    binary = isinstance(index, faiss.IndexBinary)
    return (faiss.serialize_index_binary(index) if binary else faiss.serialize_index(index)).tobytes()


def deserialize(data: bytes, quantization: str):
    array = np.frombuffer(data, dtype=np.uint8)
    return (
        faiss.deserialize_index_binary(array) if quantization == "binary" else faiss.deserialize_index(array)
    )


def trained_template(quantization: str, index_type: str, dim: int, params: dict, sample: np.ndarray) -> bytes:
    """The serialized empty index every shard starts from; IVF coarse quantizers are trained here, once."""
    index = empty_index(quantization, index_type, dim, params)
    if not index.is_trained:
        index.train(faiss_vectors(sample, quantization, params))
    return serialize(index)


def shard_index(template: bytes, vectors: np.ndarray, quantization: str, params: dict) -> bytes:
    """The template with one shard's vectors added, serialized."""
    index = deserialize(template, quantization)
    if len(vectors):
        index.add(faiss_vectors(vectors, quantization, params))
    return serialize(index)


def flat_index(vectors: np.ndarray, quantization: str):
    """The flat index of a shard, made at load time from its stored vectors (None for int8: it is scanned)."""
    if quantization == "int8":
        return None
    width = vectors.shape[1] * (8 if quantization == "binary" else 1)
    index = empty_index(quantization, "flat", width, {})
    if len(vectors):
        index.add(faiss_vectors(vectors, quantization, {}))
    return index


def set_search_params(index, params: dict) -> None:
    if "nprobe" in params and hasattr(index, "nprobe"):
        index.nprobe = params["nprobe"]
    if "ef_search" in params and hasattr(index, "hnsw"):
        index.hnsw.efSearch = params["ef_search"]



def exhaustive(queries: np.ndarray, vectors: np.ndarray, k: int, quantization: str) -> SearchResult:
    """Exact top-k by ``similarity`` over all stored vectors, scanned in blocks."""
    best = SearchResult.empty(len(queries), 0)
    for first in range(0, len(vectors), SCAN_ROWS):
        scores = similarity(queries, vectors[first : first + SCAN_ROWS], quantization)
        positions = np.broadcast_to(np.arange(first, first + scores.shape[1]), scores.shape)
        take = min(k, scores.shape[1])
        part = np.argpartition(-scores, take - 1, axis=1)[:, :take]
        best = top_k_candidates(
            np.hstack([best.scores, np.take_along_axis(scores, part, 1)]),
            np.hstack([best.positions, np.take_along_axis(positions, part, 1)]),
            k,
        )
    return top_k_candidates(best.scores, best.positions, k)


def rescore(
    queries: np.ndarray, vectors: np.ndarray, candidates: np.ndarray, quantization: str, k: int
) -> SearchResult:
    """Exact scores of each query's candidate rows, best ``k`` kept."""
    scores = np.full(candidates.shape, -np.inf, dtype=np.float32)
    for row in range(len(queries)):
        valid = candidates[row] >= 0
        if valid.any():
            scores[row, valid] = similarity(
                queries[row : row + 1], vectors[candidates[row, valid]], quantization
            )[0]
    return top_k_candidates(scores, candidates, k)


def is_centred_binary(queries: np.ndarray, quantization: str) -> bool:
    """Float queries of a binary index: scored asymmetrically (``asymmetric_binary_similarity``)."""
    return quantization == "binary" and queries.dtype.kind == "f"


def search_shard(
    index, vectors: np.ndarray, queries: np.ndarray, k: int, quantization: str, index_type: str, params: dict
) -> SearchResult:
    """Top-``k`` rows (positions) of one shard for stored-form queries, with exact scores."""
    if len(vectors) == 0:
        return SearchResult.empty(len(queries), k)
    if index_type == "flat" and (quantization == "int8" or is_centred_binary(queries, quantization)):
        return exhaustive(queries, vectors, k, quantization)
    set_search_params(index, params)
    fetch = min(len(vectors), k if index_type == "flat" else k * params.get("rerank_factor", 1))
    _, candidates = index.search(faiss_queries(queries, quantization, params), fetch)
    return rescore(queries, vectors, candidates.astype(np.int64), quantization, k)


class Shard:
    """One shard in memory: its FAISS index, stored vectors (for exact scores) and ids."""

    def __init__(
        self, ids: list[str], vectors: np.ndarray, index, quantization: str, index_type: str, params: dict
    ):
        self.ids, self.vectors, self.index = ids, vectors, index
        self.quantization, self.index_type, self.params = quantization, index_type, dict(params)

    @classmethod
    def load(cls, base: str, entry: dict, manifest: dict) -> Shard:
        """Read one shard of ``manifest`` from storage, checking both files against their checksums."""
        quantization = manifest["quantization"]
        url = storage.join(base, f"{entry['name']}.parquet")
        table = pq.read_table(io.BytesIO(read_checked(url, entry["parquet_sha256"])), columns=["id", "vector"])
        width, dtype = output_width(manifest["dim"], quantization), output_dtype(quantization)
        check_shard_count(url, table.num_rows, entry["rows"])
        check_vector_width(url, table.column("vector"), width * dtype.itemsize, f"dim {manifest['dim']} {quantization}")
        ids = table.column("id").to_pylist()
        vectors = column_matrix(table.column("vector"), dtype) if ids else np.zeros((0, width), dtype)
        if "faiss_sha256" in entry:
            faiss_url = storage.join(base, f"{entry['name']}.faiss")
            index = deserialize(read_checked(faiss_url, entry["faiss_sha256"]), quantization)
            check_shard_count(faiss_url, index.ntotal, entry["rows"], "vectors")
        else:  # flat shards store no FAISS file: the index is made from the stored vectors
            index = flat_index(vectors, quantization)
        return cls(ids, vectors, index, quantization, manifest["index"]["type"], manifest["index"]["params"])

    def search(self, queries: np.ndarray, k: int, overrides: dict) -> SearchResult:
        found = search_shard(
            self.index, self.vectors, queries, k, self.quantization, self.index_type, self.params | overrides
        )
        return found.named(self.ids)
