"""Retrieval systems compared side by side: a model's exact (or in-process ANN) FAISS search in float, int8 or
binary, a BM25 baseline, and a published ``ShardedIndex``.

Every system answers ``search(queries, k) -> SearchResult`` (scores ``(n, k)`` float32 and ids), best first,
after ``build(parts)`` over the corpus given as ``(ids, texts)`` parts (a dataset's corpus, distractors).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
from tqdm.auto import tqdm

from embedlib import storage
from embedlib.encoding.encoder import Encoder
from embedlib.encoding.formats import Quantization, binary_queries, output_dtype, output_width
from embedlib.eval.embeddings import PrefixCache, encode_float, quantized
from embedlib.index.faiss_shards import exhaustive, faiss_queries, rescore
from embedlib.search.bm25 import BM25Index
from embedlib.search.results import SearchResult

Part = tuple[Sequence[str], Sequence[str]]  # (ids, texts)
SEARCH_BATCH = 1024
ANN_TYPES = ("exact", "hnsw")
CENTRED_BINARY_RERANK = 10  # HNSW candidates per result re-scored with a centred binary system's float queries


class System:
    """One retrieval system of an evaluation run."""

    name: str
    kind: str = "system"

    def build(self, parts: Sequence[Part]) -> None:
        """Index the corpus given as ``(ids, texts)`` parts."""
        raise NotImplementedError

    def search(self, queries: Sequence[str], k: int) -> SearchResult:
        raise NotImplementedError

    def bytes_per_doc(self) -> float:
        """Bytes the built index stores per document."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"kind": self.kind}


class ModelEmbeddings:
    """A model's float embeddings, encoded once per text list (and prefixes of it), optionally cached."""

    def __init__(self, name: str, encoder: Encoder, cache: str | None = None, show_progress: bool = True):
        self.name = name
        self.encoder = encoder
        self.cache = cache
        self.show_progress = show_progress
        self._encoded = PrefixCache()

    @classmethod
    def load(cls, name: str, path_or_url: str, cache: str | None = None, max_length: int | None = None,
             show_progress: bool = True) -> ModelEmbeddings:
        return cls(name, Encoder.from_pretrained(path_or_url, max_length=max_length), cache, show_progress)

    def float_vectors(self, texts: Sequence[str], desc: str = "encode") -> np.ndarray:
        """Float32 embeddings of ``texts``; a list that is a prefix of one already encoded is not re-encoded."""
        return self._encoded.get(
            texts,
            lambda new: encode_float(self.encoder, new, self.cache, desc=f"{self.name}: {desc}",
                                     show_progress=self.show_progress),
            lambda vectors, n: vectors[:n],
        )


class DenseSystem(System):
    """A model's embeddings in one quantization, searched exactly (FAISS flat) or with an in-process HNSW.

    float and int8 are scored by cosine (inner product of L2-normalised vectors), binary by ``-Hamming``, or for
    a model with a binary centre by the float query's cosine with the ``±1`` codes (as its index serves them).
    """

    kind = "dense"

    def __init__(self, model: ModelEmbeddings, quantization: Quantization, dim: int | None = None,
                 ann: str = "exact", hnsw_m: int = 32, ef_search: int = 128):
        if ann not in ANN_TYPES:
            raise ValueError(f"ann must be one of {ANN_TYPES}, got {ann!r}")
        self.model = model
        self.quantization = quantization
        self.dim = dim or model.encoder.dim
        self.ann = ann
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        suffix = "" if ann == "exact" else f"/{ann}"
        self.name = f"{model.name}/{quantization}" + (f"@{dim}" if dim else "") + suffix
        self.ids: list[str] = []
        self.index = None
        self.codes: np.ndarray | None = None

    def describe(self) -> dict:
        return {"kind": self.kind, "model": self.model.name, "source": storage.redact_url(self.model.encoder.source),
                "quantization": self.quantization, "dim": self.dim, "search": self.ann}

    @property
    def centre(self) -> np.ndarray | None:
        """The model's binary centre when this system is binary: codes ``sign(x - c)``, float queries ``x - c``."""
        return self.model.encoder.binary_centre if self.quantization == "binary" else None

    def _query_vectors(self, texts: Sequence[str]) -> np.ndarray:
        if self.centre is not None:
            return binary_queries(self.model.float_vectors(texts, "queries")[:, : self.dim], self.centre)
        return self._vectors(texts, "queries")

    def _vectors(self, texts: Sequence[str], desc: str) -> np.ndarray:
        codes = quantized(self.model.float_vectors(texts, desc), self.quantization, self.dim, self.centre)
        if self.quantization == "binary":
            return np.ascontiguousarray(codes)
        vectors = np.array(codes, dtype=np.float32)  # a copy: float codes share memory with the cached vectors
        faiss.normalize_L2(vectors)  # in place
        return vectors

    def _new_index(self):
        if self.quantization == "binary":
            if self.ann == "hnsw":
                return faiss.IndexBinaryHNSW(self.dim, self.hnsw_m)
            return faiss.IndexBinaryFlat(self.dim)
        if self.ann == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = self.ef_search
            return index
        return faiss.IndexFlatIP(self.dim)

    def build(self, parts: Sequence[Part]) -> None:
        # a centred binary system re-scores (or, exact, scans) the stored codes with float queries: the exact scan
        # needs no FAISS index, HNSW only proposes candidates
        centred = self.centre is not None
        self.index = None if centred and self.ann == "exact" else self._new_index()
        self.ids = []
        codes = []
        for number, (ids, texts) in enumerate(parts):
            vectors = self._vectors(texts, "corpus" if number == 0 else f"corpus part {number + 1}")
            if self.index is not None:
                self.index.add(vectors)
            self.ids.extend(ids)
            codes.append(vectors)
        self.codes = np.concatenate(codes) if centred and codes else None

    def search(self, queries: Sequence[str], k: int) -> SearchResult:
        vectors = self._query_vectors(queries)
        k = min(k, len(self.ids))
        scores = np.zeros((len(vectors), k), dtype=np.float32)
        positions = np.zeros((len(vectors), k), dtype=np.int64)
        if self.quantization == "binary" and self.ann == "hnsw":
            self.index.hnsw.efSearch = max(self.ef_search, k)
        with tqdm(total=len(vectors), desc=f"search {self.name}", unit="query",
                  disable=not self.model.show_progress) as bar:
            for start in range(0, len(vectors), SEARCH_BATCH):
                batch = slice(start, start + SEARCH_BATCH)
                found_scores, found_positions = self._search_batch(vectors[batch], k)
                scores[batch], positions[batch] = found_scores, found_positions
                bar.update(len(found_scores))
        return SearchResult(positions=positions, scores=scores).named(self.ids)

    def _search_batch(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.codes is not None:
            return self._search_centred_binary(vectors, k)
        if self.quantization == "binary":
            distances, positions = self.index.search(vectors, k)
            return -distances.astype(np.float32), positions
        if self.ann == "hnsw":
            self.index.hnsw.efSearch = max(self.ef_search, k)
        return self.index.search(vectors, k)

    def _search_centred_binary(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """As a centred binary shard answers: an exact scan, or HNSW's Hamming candidates re-scored."""
        if self.ann == "exact":
            found = exhaustive(queries, self.codes, k, "binary")
        else:
            fetch = min(len(self.ids), k * CENTRED_BINARY_RERANK)
            self.index.hnsw.efSearch = max(self.ef_search, fetch)
            _, candidates = self.index.search(faiss_queries(queries, "binary", {}), fetch)
            found = rescore(queries, self.codes, candidates.astype(np.int64), "binary", k)
        return found.scores, found.positions

    def bytes_per_doc(self) -> float:
        """Stored code bytes per document (4·d float, d int8, d/8 binary), plus the HNSW graph if any."""
        code = output_width(self.dim, self.quantization) * output_dtype(self.quantization).itemsize
        if self.ann == "exact":
            return float(code)
        serialize = faiss.serialize_index_binary if self.quantization == "binary" else faiss.serialize_index
        graph = len(serialize(self.index)) - len(serialize(self.index.storage))
        return code + graph / max(self.index.ntotal, 1)


class BM25System(System):
    """The bm25s baseline (English stop words, Snowball stemming) from ``embedlib.search.bm25``."""

    kind = "bm25"

    def __init__(self, name: str = "bm25", show_progress: bool = True):
        self.name = name
        self.show_progress = show_progress
        self.bm25: BM25Index | None = None

    def build(self, parts: Sequence[Part]) -> None:
        ids = [i for part_ids, _ in parts for i in part_ids]
        texts = [t for _, part_texts in parts for t in part_texts]
        self.bm25 = BM25Index(ids, texts, show_progress=self.show_progress)

    def search(self, queries: Sequence[str], k: int) -> SearchResult:
        return self.bm25.search(list(queries), k)

    def bytes_per_doc(self) -> float:
        """The size of the saved bm25s index (sparse score matrix and vocabulary) per document."""
        with tempfile.TemporaryDirectory() as folder:
            self.bm25._bm25.save(folder)
            size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
        return size / len(self.bm25.ids)


class ShardedIndexSystem(System):
    """A published ``embedlib.index.ShardedIndex``, evaluated in place (its corpus is what it indexed)."""

    kind = "index"

    def __init__(self, url: str, model: Encoder | None = None, name: str | None = None):
        from embedlib.index import ShardedIndex

        self.url = url
        self.index = ShardedIndex.open(url, model=model)
        from embedlib.index.methods import manifest_method

        stored = manifest_method(self.index.manifest).label(self.index.manifest)
        self.name = name or f"index:{url.rstrip('/').rsplit('/', 1)[-1]}/{stored}"

    def describe(self) -> dict:
        manifest = self.index.manifest
        return {"kind": self.kind, "url": self.url, "method": self.index.method,
                "quantization": manifest["quantization"],
                "dim": manifest["dim"], "model": manifest["model"].get("source"),
                "index_type": manifest["index"]["type"], "version": manifest.get("version")}

    def build(self, parts: Sequence[Part]) -> None:
        """Nothing to build: the published index is searched as it is."""

    def search(self, queries: Sequence[str], k: int) -> SearchResult:
        return self.index.search(list(queries), k)

    def bytes_per_doc(self) -> float:
        """Bytes of the published shard files (parquet vectors + FAISS index, from the manifest) per document."""
        shards = self.index.manifest["shards"]
        docs = sum(entry.get("docs", entry["rows"]) for entry in shards)
        return sum(entry["bytes"] for entry in shards) / max(docs, 1)
