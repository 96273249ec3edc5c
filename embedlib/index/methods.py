"""One plug-in object per indexing method: what ``build_index``, ``ShardedIndex`` and evaluation call.

A method says how its model is identified, how documents become stored vectors (in the encoder actors), which
files a shard holds and how they are loaded, and how queries are encoded and searched. ``dense`` (one pooled,
quantized vector per document or chunk) and ``diffretriever`` (K_p mask-token vectors plus a sparse term vector
per document) are the two implementations; nothing else branches on the method's name.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlib.encoding.formats import output_dtype, output_width
from embedlib.index.columns import column_matrix, sparse_columns, vector_type, vectors_column
from embedlib.index.config import IndexJobConfig

if TYPE_CHECKING:
    from embedlib.encoding.encoder import Encoder
    from embedlib.search.results import SearchResult


@dataclass
class EncodedDocs:
    """What an actor produced for a batch of texts: ``rows`` index rows, ``owner[i]`` the text of row i."""

    owner: np.ndarray
    chunk: np.ndarray
    start: np.ndarray
    end: np.ndarray
    tokens: np.ndarray  # per row: the whole text's token count (after truncation)
    columns: dict[str, pa.Array]  # "vector" (and the method's other stored columns)


def parquet_bytes(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


class IndexMethod:
    """The interface; see the module docstring."""

    name: ClassVar[str]
    multi_vector: ClassVar[bool] = False

    # --- build ----------------------------------------------------------------------------------------------

    def identity(self, model: str, cfg: IndexJobConfig) -> dict:
        """``weights_hash``, ``max_length``, ``width`` of the model (plus what the method needs)."""
        raise NotImplementedError

    def spec(self, cfg: IndexJobConfig) -> dict | None:
        """What besides model, quantization, dim, chunking and max length decides an encoding."""
        return None

    def encoding_spec(self, cfg: IndexJobConfig, identity: dict) -> dict | None:
        """``spec`` plus what of the model's identity besides its weights decides an encoding."""
        return self.spec(cfg)

    def vector_type(self, cfg: IndexJobConfig, identity: dict) -> dict[str, pa.DataType]:
        """The stored columns that carry a document's representation, and their arrow types."""
        raise NotImplementedError

    def load_encoder(self, model: str, cfg: IndexJobConfig, device: str | None, dtype: str | None):
        raise NotImplementedError

    def encode(self, encoder, texts: list[str], cfg: IndexJobConfig, types: dict[str, pa.DataType]) -> EncodedDocs:
        """Texts -> index rows (inside an encoder actor)."""
        raise NotImplementedError

    def index_params(self, cfg: IndexJobConfig, sample: np.ndarray | None, rows: int, dim: int) -> dict:
        """The index parameters recorded in the manifest (``sample``: stored vectors for training)."""
        raise NotImplementedError

    def needs_training_sample(self, cfg: IndexJobConfig) -> bool:
        return False

    def template(self, cfg: IndexJobConfig, params: dict, dim: int, sample: np.ndarray | None) -> bytes | None:
        """What every shard's index starts from (a trained, empty FAISS index), or None."""
        return None

    def shard_files(self, table: pa.Table, manifest: dict, template: bytes | None) -> dict[str, bytes]:
        """The files of one shard, by suffix (``parquet`` always: ids, metadata and stored vectors)."""
        raise NotImplementedError

    def manifest_fields(self, cfg: IndexJobConfig, identity: dict, params: dict) -> dict:
        """What the manifest records about the method (quantization, index type and parameters, ...)."""
        raise NotImplementedError

    # --- search ---------------------------------------------------------------------------------------------

    def load_shard(self, base: str, entry: dict, manifest: dict):
        raise NotImplementedError

    def query_encoder(self, path_or_url: str, manifest: dict):
        raise NotImplementedError

    def search(self, index, queries: Any, k: int, **options) -> SearchResult:
        """Top-``k`` scores and ids of a ``ShardedIndex`` of this method."""
        raise NotImplementedError

    def label(self, manifest: dict) -> str:
        """A short name of what the index stores (used in system names)."""
        raise NotImplementedError


class DenseMethod(IndexMethod):
    """One pooled vector per document (or late-chunking span), float / INT8 / binary, in FAISS shards."""

    name = "dense"

    def identity(self, model: str, cfg: IndexJobConfig) -> dict:
        from embedlib.encoding.encoder import Encoder

        encoder = Encoder.from_pretrained(model, device="cpu")
        identity = {"weights_hash": encoder.weights_hash, "max_length": encoder.max_length, "width": encoder.dim}
        if encoder.binary_centre is not None:
            identity["binary_centre"] = [float(v) for v in encoder.binary_centre]
        return identity

    def encoding_spec(self, cfg: IndexJobConfig, identity: dict) -> dict | None:
        if cfg.quantization == "binary" and "binary_centre" in identity:
            return {"binary_centre_sha256": hashlib.sha256(json.dumps(identity["binary_centre"]).encode()).hexdigest()}
        return None

    def vector_type(self, cfg: IndexJobConfig, identity: dict) -> dict[str, pa.DataType]:
        width = output_width(cfg.dim or identity["width"], cfg.quantization)
        return {"vector": vector_type(width, output_dtype(cfg.quantization))}

    def load_encoder(self, model: str, cfg: IndexJobConfig, device: str | None, dtype: str | None) -> Encoder:
        from embedlib.encoding.encoder import Encoder

        return Encoder.from_pretrained(model, device=device, dtype=dtype)

    def encode(self, encoder: Encoder, texts: list[str], cfg: IndexJobConfig, types: dict) -> EncodedDocs:
        n = len(texts)
        if cfg.chunk_tokens is None:
            vectors = encoder.encode(texts, cfg.quantization, cfg.dim, max_tokens_per_batch=cfg.max_tokens_per_batch)
            lengths = np.asarray(encoder.last_stats.lengths if n else [], np.int32)
            return EncodedDocs(
                owner=np.arange(n), chunk=np.zeros(n, np.int32), start=np.zeros(n, np.int32),
                end=np.full(n, -1, np.int32), tokens=lengths, columns={"vector": vectors_column(vectors, types["vector"])},
            )
        chunks = encoder.encode_chunks(
            texts, cfg.chunk_tokens, cfg.quantization, cfg.dim, max_tokens_per_batch=cfg.max_tokens_per_batch
        )
        lengths = encoder.last_stats.lengths
        owner = np.repeat(np.arange(n), [len(c) for c in chunks])
        flat = [c for doc in chunks for c in doc]
        dtype = output_dtype(cfg.quantization)
        width = types["vector"].byte_width // dtype.itemsize
        vectors = np.stack([c.vector for c in flat]) if flat else np.zeros((0, width), dtype)
        return EncodedDocs(
            owner=owner,
            chunk=np.concatenate([np.arange(len(c), dtype=np.int32) for c in chunks]) if n else np.zeros(0, np.int32),
            start=np.asarray([c.start for c in flat], np.int32),
            end=np.asarray([c.end for c in flat], np.int32),
            tokens=np.asarray(lengths, np.int32)[owner] if n else np.zeros(0, np.int32),
            columns={"vector": vectors_column(vectors, types["vector"])},
        )

    def needs_training_sample(self, cfg: IndexJobConfig) -> bool:
        return cfg.index_type != "flat"

    def index_params(self, cfg: IndexJobConfig, sample: np.ndarray | None, rows: int, dim: int) -> dict:
        from embedlib.index.faiss_shards import default_params

        if cfg.index_type == "flat":
            return {}
        return default_params(cfg.index_type, cfg.quantization, dim, sample, rows, cfg)

    def template(self, cfg: IndexJobConfig, params: dict, dim: int, sample: np.ndarray | None) -> bytes | None:
        from embedlib.index.faiss_shards import trained_template

        if cfg.index_type == "flat":
            return None  # flat shards are scanned (int8) or indexed at load from the stored vectors
        return trained_template(cfg.quantization, cfg.index_type, dim, params, sample)

    def shard_files(self, table: pa.Table, manifest: dict, template: bytes | None) -> dict[str, bytes]:
        from embedlib.index.faiss_shards import shard_index

        files = {"parquet": parquet_bytes(table)}
        if template is not None:
            quantization = manifest["quantization"]
            vectors = column_matrix(table.column("vector"), output_dtype(quantization))
            files["faiss"] = shard_index(template, vectors, quantization, manifest["index"]["params"])
        return files

    def manifest_fields(self, cfg: IndexJobConfig, identity: dict, params: dict) -> dict:
        fields = {"quantization": cfg.quantization, "index": {"type": cfg.index_type, "params": params}}
        if cfg.quantization == "binary" and "binary_centre" in identity:
            fields["binary_centre"] = identity["binary_centre"]  # queries are float, centred on it
        return fields

    def load_shard(self, base: str, entry: dict, manifest: dict):
        from embedlib.index.faiss_shards import Shard

        return Shard.load(base, entry, manifest)

    def query_encoder(self, path_or_url: str, manifest: dict) -> Encoder:
        from embedlib.encoding.encoder import Encoder

        return Encoder.from_pretrained(path_or_url)

    def search(self, index, queries: Any, k: int, nprobe: int | None = None, ef_search: int | None = None):
        vectors = index.check_vectors(queries) if isinstance(queries, np.ndarray) else index.encode_queries(queries)
        overrides = {name: value for name, value in (("nprobe", nprobe), ("ef_search", ef_search)) if value}
        from embedlib.search.results import merge_results

        return merge_results(index.call_shards("search", vectors, k, overrides), len(vectors), k)

    def label(self, manifest: dict) -> str:
        return manifest["quantization"]


class DiffRetrieverMethod(IndexMethod):
    """A diffusion LM's K_p mask-token vectors (MaxSim) and a sparse term vector per document, one pass each."""

    name = "diffretriever"
    multi_vector = True
    vector_dtype = "float16"  # the K_p vectors as stored (parquet and FAISS): half of float32's bytes

    def identity(self, model: str, cfg: IndexJobConfig) -> dict:
        lm = self.load_encoder(model, cfg, "cpu", None)
        return {"weights_hash": lm.weights_hash, "max_length": lm.max_length, "width": lm.dim,
                "vocab_size": lm.vocab_size}

    def spec(self, cfg: IndexJobConfig) -> dict | None:
        return {"method": self.name, "k_passage": cfg.k_passage, "top_terms": cfg.top_terms,
                "vector_dtype": self.vector_dtype}

    def vector_type(self, cfg: IndexJobConfig, identity: dict) -> dict[str, pa.DataType]:
        return {
            "vector": vector_type(cfg.k_passage * identity["width"], np.dtype(self.vector_dtype)),
            "sparse_ids": pa.list_(pa.int32()),
            "sparse_weights": pa.list_(pa.float32()),
        }

    def load_encoder(self, model: str, cfg: IndexJobConfig, device: str | None, dtype: str | None):
        from embedlib.encoding.representative_tokens import DiffRetrieverEncoder

        return DiffRetrieverEncoder.from_pretrained(model, device=device, dtype=dtype, top_terms=cfg.top_terms)

    def encode(self, encoder, texts: list[str], cfg: IndexJobConfig, types: dict) -> EncodedDocs:
        n = len(texts)
        prompts, _ = encoder.masked_prompts(texts, cfg.k_passage, "passage")
        found = encoder.encode(texts, k=cfg.k_passage, kind="passage", max_tokens_per_batch=cfg.max_tokens_per_batch)
        width = cfg.k_passage * encoder.dim
        dense = np.stack(found.dense).reshape(n, -1) if n else np.zeros((0, width), np.float32)
        return EncodedDocs(
            owner=np.arange(n), chunk=np.zeros(n, np.int32), start=np.zeros(n, np.int32),
            end=np.full(n, -1, np.int32), tokens=np.asarray([len(p) for p in prompts], np.int32),
            columns={"vector": vectors_column(dense.astype(self.vector_dtype), types["vector"]),
                     **sparse_columns(found.sparse)},
        )

    def index_params(self, cfg: IndexJobConfig, sample: np.ndarray | None, rows: int, dim: int) -> dict:
        from embedlib.index.representative_shards import DEFAULT_PARAMS

        return dict(DEFAULT_PARAMS)

    def shard_files(self, table: pa.Table, manifest: dict, template: bytes | None) -> dict[str, bytes]:
        from embedlib.index.representative_shards import shard_index_files

        index_files = shard_index_files(table, manifest)
        return {"parquet": parquet_bytes(table), **index_files}

    def manifest_fields(self, cfg: IndexJobConfig, identity: dict, params: dict) -> dict:
        return {"quantization": "float", "vector_dtype": self.vector_dtype,
                "index": {"type": "multivector+sparse", "params": params},
                "k_passage": cfg.k_passage, "k_query": cfg.k_query, "top_terms": cfg.top_terms,
                "vocab_size": identity["vocab_size"]}

    def load_shard(self, base: str, entry: dict, manifest: dict):
        from embedlib.index.representative_shards import RepresentativeShard

        return RepresentativeShard.load(base, entry, manifest)

    def query_encoder(self, path_or_url: str, manifest: dict):
        from embedlib.encoding.representative_tokens import DiffRetrieverEncoder

        return DiffRetrieverEncoder.from_pretrained(path_or_url, top_terms=manifest["top_terms"])

    def search(self, index, queries: Any, k: int, mode: str = "hybrid", k_query: int | None = None,
               dense_weight: float | None = None, candidates: int | None = None, **unused):
        """Texts (encoded with ``k_query`` mask tokens, the manifest's by default) or ``RepresentativeTokens``."""
        from embedlib.encoding.representative_tokens import RepresentativeTokens
        from embedlib.index.representative_shards import fuse_shard_candidates
        from embedlib.search.hybrid import DEFAULT_DENSE_WEIGHT, MODES
        from embedlib.search.results import merge_results

        if unused:
            raise ValueError(f"{sorted(unused)}: not used by a diffretriever index (IVF/HNSW options of dense ones)")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(queries, RepresentativeTokens):
            tokens = queries
        else:
            tokens = index.encoder.encode(list(queries), k=k_query or index.manifest["k_query"], kind="query")
        if mode != "hybrid":
            return merge_results(index.call_shards("search", tokens, k, mode), len(tokens), k)
        per_shard = index.call_shards(
            "hybrid_candidates", tokens, candidates or index.manifest["index"]["params"]["candidates"]
        )
        weight = DEFAULT_DENSE_WEIGHT if dense_weight is None else dense_weight
        return fuse_shard_candidates(per_shard, len(tokens), k, weight)

    def label(self, manifest: dict) -> str:
        return self.name


METHODS: dict[str, IndexMethod] = {m.name: m for m in (DenseMethod(), DiffRetrieverMethod())}


def index_method(name: str) -> IndexMethod:
    """The plug-in for a method name (a config's ``method`` or a manifest's)."""
    if name not in METHODS:
        raise ValueError(f"unknown index method {name!r}; known: {sorted(METHODS)}")
    return METHODS[name]


def manifest_method(manifest: dict) -> IndexMethod:
    return index_method(manifest.get("method", "dense"))

