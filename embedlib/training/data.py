"""Training data: Ray Datasets from parquet/jsonl at any fsspec URL, BEIR converters, hard-negative mining.

Row formats (one dict per example):
- pretrain: ``{"text"}``;
- pair: ``{"query", "positive"}`` (optional ``"doc_id"``: equal ids are the same document);
- triplet: ``{"query", "positive", "negatives": [...]}``;
- contextual: ``{"query", "chunks": [...], "gold": int}`` (optional ``"doc_id"``);
- diffretriever: pair rows (``hard_negatives: 0``) or triplet rows.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from embedlib import storage
from embedlib.encoding.formats import similarity
from embedlib.errors import UserError
from embedlib.eval.beir import BeirDataset
from embedlib.search.bm25 import BM25Index

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = {
    "pretrain": ("text",),
    "pair": ("query", "positive"),
    "triplet": ("query", "positive", "negatives"),
    "contextual": ("query", "chunks", "gold"),
}


def row_format(stage: str, hard_negatives: int) -> str:
    """The rows a stage reads (a ``REQUIRED_COLUMNS`` key): diffretriever reads pairs, or triplets with negatives."""
    if stage == "diffretriever":
        return "triplet" if hard_negatives > 0 else "pair"
    return stage


class DataError(UserError, ValueError):
    """Training data that cannot be used; the message names the URL and what is wrong."""


def data_format(url: str, declared: str | None) -> str:
    if declared:
        return declared
    name = url.rstrip("/").lower()
    if name.endswith((".jsonl", ".json", ".jsonl.gz")):
        return "jsonl"
    return "parquet"


def arrow_filesystem(url: str):
    """A pyarrow filesystem over the fsspec one for ``url`` (so s3 endpoints come from the environment)."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs, path = storage.filesystem(url)
    return PyFileSystem(FSSpecHandler(fs)), path


def read_table(url: str, declared_format: str | None = None) -> pa.Table:
    """A parquet/jsonl file or folder of files read here with pyarrow (through fsspec)."""
    import pyarrow.dataset as pads

    filesystem, path = arrow_filesystem(url)
    fmt = "json" if data_format(url, declared_format) == "jsonl" else "parquet"
    return pads.dataset(path, filesystem=filesystem, format=fmt).to_table()


def sample_documents(url: str, count: int, seed: int, declared_format: str | None = None) -> list[str]:
    """Up to ``count`` distinct ``positive`` texts of pair/triplet rows, drawn at random (``seed``) from the
    whole file or folder, so that every source of a mixture is represented."""
    import pyarrow.dataset as pads

    filesystem, path = arrow_filesystem(url)
    fmt = "json" if data_format(url, declared_format) == "jsonl" else "parquet"
    dataset = pads.dataset(path, filesystem=filesystem, format=fmt)
    rows = dataset.count_rows()
    picked = np.sort(np.random.default_rng(seed).choice(rows, size=min(count, rows), replace=False))
    texts = dataset.take(pa.array(picked), columns=["positive"]).column("positive").to_pylist()
    return list(dict.fromkeys(texts))


def read_dataset(url: str, stage: str, declared_format: str | None = None, stream: bool = False):
    """A Ray Dataset of training rows, after checking the stage's columns are present.

    ``stream``: Ray Data read tasks stream the files (corpora larger than memory); otherwise the rows are
    read here and put in the object store (no read tasks to schedule: much faster for small sets).
    """
    import ray.data

    if stream:
        filesystem, path = arrow_filesystem(url)
        reader = ray.data.read_json if data_format(url, declared_format) == "jsonl" else ray.data.read_parquet
        dataset = reader(path, filesystem=filesystem)
    else:
        dataset = ray.data.from_arrow(read_table(url, declared_format))
    columns = set(dataset.columns() or [])
    missing = [c for c in REQUIRED_COLUMNS[stage] if c not in columns]
    if missing:
        raise DataError(
            f"{url}: stage {stage!r} needs columns {list(REQUIRED_COLUMNS[stage])}, missing {missing}"
        )
    return dataset


def write_rows(rows: Sequence[dict], url: str) -> None:
    """Write rows as one parquet file (``.parquet``) or JSON lines (``.jsonl``) at ``url``, atomically."""
    if not rows:
        raise DataError(f"{url}: refusing to write an empty training file")
    if data_format(url, None) == "jsonl":
        payload = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    else:
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(list(rows)), buffer)
        payload = buffer.getvalue()
    storage.write_bytes_atomic(url, payload)


# --- converters -------------------------------------------------------------------------------------------


def beir_pairs(dataset: BeirDataset, min_relevance: int = 1) -> list[dict]:
    """One ``{"query", "positive", "query_id", "doc_id"}`` row per relevant qrels entry."""
    texts = dict(zip(dataset.doc_ids(), dataset.doc_texts(), strict=True))
    rows = []
    for qid, docs in dataset.qrels.items():
        for did, relevance in docs.items():
            if relevance >= min_relevance:
                rows.append(
                    {"query": dataset.queries[qid], "positive": texts[did], "query_id": qid, "doc_id": did}
                )
    return rows


def sentence_chunks(text: str, sentences_per_chunk: int = 2) -> list[str]:
    """``text`` cut at sentence ends into chunks of ``sentences_per_chunk`` sentences."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]
    return [
        " ".join(sentences[start : start + sentences_per_chunk])
        for start in range(0, len(sentences), sentences_per_chunk)
    ]


def beir_contextual_rows(
    dataset: BeirDataset, sentences_per_chunk: int = 2, min_chunks: int = 2, min_relevance: int = 1
) -> list[dict]:
    """Contextual rows from qrels: each relevant document cut into sentence chunks, ``gold`` the chunk BM25
    ranks first for the query (BEIR judges whole documents, so the gold chunk is a lexical estimate).
    Documents with fewer than ``min_chunks`` chunks are left out."""
    pairs = beir_pairs(dataset, min_relevance)
    chunked: dict[str, list[str]] = {}
    for pair in pairs:
        if pair["doc_id"] not in chunked:
            chunked[pair["doc_id"]] = sentence_chunks(pair["positive"], sentences_per_chunk)
    kept = {doc: chunks for doc, chunks in chunked.items() if len(chunks) >= min_chunks}
    if not kept:
        raise DataError(f"no relevant document has {min_chunks} or more chunks of {sentences_per_chunk} sentences")
    first_chunk, texts = {}, []
    for doc, chunks in kept.items():
        first_chunk[doc] = len(texts)
        texts.extend(chunks)
    index = BM25Index([str(i) for i in range(len(texts))], texts)
    rows = []
    for pair in pairs:
        if pair["doc_id"] not in kept:
            continue
        chunks = kept[pair["doc_id"]]
        start = first_chunk[pair["doc_id"]]
        gold = int(np.argmax(index.scores(pair["query"])[start : start + len(chunks)]))
        rows.append(
            {
                "query": pair["query"],
                "chunks": chunks,
                "gold": gold,
                "query_id": pair["query_id"],
                "doc_id": pair["doc_id"],
            }
        )
    dropped = len(chunked) - len(kept)
    log.info("%d contextual rows; %d of %d documents had too few chunks", len(rows), dropped, len(chunked))
    return rows


def text_rows(paths: Iterable[str | Path], chars_per_row: int = 2000, min_chars: int = 200) -> list[dict]:
    """Plain text files cut into ``{"text"}`` rows of about ``chars_per_row`` characters at line breaks."""
    rows = []
    for path in paths:
        text = storage.read_bytes(str(path)).decode("utf-8", errors="replace")
        current: list[str] = []
        size = 0
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            current.append(line)
            size += len(line) + 1
            if size >= chars_per_row:
                rows.append({"text": " ".join(current)})
                current, size = [], 0
        if size >= min_chars:
            rows.append({"text": " ".join(current)})
    return rows


# --- hard-negative mining -----------------------------------------------------------------------------------


def _triplets_from_ranking(
    pairs: Sequence[dict], dataset: BeirDataset, ranked: np.ndarray, k: int, skip_top: int
) -> list[dict]:
    """Triplet rows: each pair plus the first ``k`` ranked documents that are not judged relevant."""
    doc_ids = dataset.doc_ids()
    texts = dataset.doc_texts()
    rows, short = [], 0
    for pair, positions in zip(pairs, ranked, strict=True):
        relevant = dataset.qrels.get(pair["query_id"], {})
        candidates = [p for p in positions if doc_ids[p] not in relevant or relevant[doc_ids[p]] <= 0]
        negatives = candidates[skip_top : skip_top + k]
        if len(negatives) < k:
            short += 1
            continue
        rows.append(
            {
                **pair,
                "negatives": [texts[p] for p in negatives],
                "negative_ids": [doc_ids[p] for p in negatives],
            }
        )
    if short:
        log.warning("%d of %d pairs had fewer than %d negatives and were dropped", short, len(pairs), k)
    return rows


def mine_bm25_negatives(
    pairs: Sequence[dict], dataset: BeirDataset, k: int = 3, skip_top: int = 0, depth: int = 30
) -> list[dict]:
    """Triplets with BM25 hard negatives: top-ranked non-relevant documents (after ``skip_top``)."""
    index = BM25Index(dataset.doc_ids(), dataset.doc_texts())
    ranked = index.search([p["query"] for p in pairs], depth).positions
    return _triplets_from_ranking(pairs, dataset, ranked, k, skip_top)


def mine_embedding_negatives(
    pairs: Sequence[dict],
    dataset: BeirDataset,
    encoder,
    k: int = 3,
    skip_top: int = 0,
    depth: int = 30,
    batch: int = 256,
) -> list[dict]:
    """Triplets with hard negatives from an existing embedding model (an ``Encoder``, INT8 cosine)."""
    docs = encoder.encode(dataset.doc_texts(), quantization="int8", show_progress=True)
    queries = encoder.encode([p["query"] for p in pairs], quantization="int8")
    ranked = []
    for start in tqdm(range(0, len(queries), batch), desc="mine", unit="batch"):
        scores = similarity(queries[start : start + batch], docs, "int8")
        ranked.append(np.argsort(-scores, axis=1)[:, :depth])
    return _triplets_from_ranking(pairs, dataset, np.concatenate(ranked), k, skip_top)
