"""The encoding stage: tokenize in Ray CPU tasks, encode in a Ray Data actor pool (one model per actor).

Output rows, one per document (or per chunk with late chunking): ``content_hash, chunk, start, end, tokens,
vector``; ``start``/``end`` are character offsets of the chunk in the embedded text (``end == -1``: whole
document), ``tokens`` the document's token count after truncation to the model's max length.

Method ``diffretriever``: the actor tokenizes too (the prompt wraps the text), ``vector`` holds the K_p
mask-position vectors flattened (``K_p * d`` float32) and ``sparse_ids``/``sparse_weights`` the sparse vector;
``tokens`` counts the whole prompt.
"""

from __future__ import annotations

import os
from functools import cache

import numpy as np
import pyarrow as pa
import ray
import scipy.sparse as sp
import torch

from embedlib import storage
from embedlib.encoding.batching import pad_batch, plan_batches
from embedlib.encoding.encoder import Encoder, embedded_text
from embedlib.encoding.quantize import mean_pool, quantize, truncate
from embedlib.index.config import IndexJobConfig
from embedlib.models.loading import Backbone, checkpoint_max_length, load_tokenizer, read_checkpoint_config


@cache
def tokenizer_only_encoder(model: str) -> Encoder:
    """An ``Encoder`` without weights: enough for ``tokenize`` in CPU tasks that must not load the model."""
    folder = storage.local_dir(model)
    config = read_checkpoint_config(folder, model)
    tokenizer = load_tokenizer(folder)
    max_length = checkpoint_max_length(folder, tokenizer, config)
    return Encoder(
        Backbone(model=None, tokenizer=tokenizer, source=model, max_length=max_length, is_decoder=False)
    )


def content_offsets(encoder: Encoder, texts: list[str]) -> list[np.ndarray]:
    """Character ``(start, end)`` of every token (special tokens get ``(0, 0)``), truncated like ``tokenize``."""
    encoded = encoder.tokenizer(
        texts,
        truncation=True,
        max_length=encoder.max_length,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    return [np.asarray(o, dtype=np.int32).reshape(-1, 2) for o in encoded["offset_mapping"]]


def tokenize_batch(batch: dict[str, np.ndarray], model: str, chunked: bool) -> pa.Table:
    """Rows ``content_hash, title, text`` -> ``content_hash, input_ids[, offsets]``."""
    encoder = tokenizer_only_encoder(model)
    texts = [embedded_text(ti, te) for ti, te in zip(batch["title"], batch["text"], strict=True)]
    ids, _ = encoder.tokenize(texts)
    columns = {
        "content_hash": pa.array(list(batch["content_hash"]), pa.string()),
        "input_ids": pa.array(ids, pa.list_(pa.int32())),
    }
    if chunked:
        columns["offsets"] = pa.array(
            [o.ravel() for o in content_offsets(encoder, texts)], pa.list_(pa.int32())
        )
    return pa.table(columns)


def chunk_spans(offsets: np.ndarray, chunk_tokens: int) -> list[tuple[np.ndarray, int, int]]:
    """Token positions and character span of each chunk of ``chunk_tokens`` content tokens."""
    content = np.flatnonzero(offsets[:, 1] > offsets[:, 0])
    if content.size == 0:
        return [(np.arange(len(offsets)), 0, 0)]
    spans = []
    for first in range(0, content.size, chunk_tokens):
        positions = content[first : first + chunk_tokens]
        spans.append((positions, int(offsets[positions, 0].min()), int(offsets[positions, 1].max())))
    return spans


def vectors_column(vectors: np.ndarray) -> pa.FixedSizeListArray:
    """A 2-D array as a fixed-size-list column (what the parquet shards store)."""
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])


def column_matrix(column: pa.ChunkedArray | pa.Array, dtype: np.dtype) -> np.ndarray:
    """The inverse of ``vectors_column``."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    width = array.type.list_size
    return np.asarray(array.flatten().to_numpy(zero_copy_only=False), dtype=dtype).reshape(-1, width)


class EncoderActor:
    """One model per actor; turns tokenized rows into quantized vectors, batching by token budget."""

    def __init__(
        self,
        model: str,
        quantization: str,
        dim: int | None,
        chunk_tokens: int | None,
        max_tokens_per_batch: int,
        torch_threads: int | None,
        device: str | None,
        dtype: str | None,
    ):
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.encoder = Encoder.from_pretrained(model, device=device, dtype=dtype)
        self.quantization, self.dim, self.chunk_tokens = quantization, dim, chunk_tokens
        self.max_tokens = max_tokens_per_batch

    @torch.inference_mode()
    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column("input_ids").to_pylist()
        hashes = batch.column("content_hash").to_pylist()
        offsets = batch.column("offsets").to_pylist() if self.chunk_tokens else None
        out = {"content_hash": [], "chunk": [], "start": [], "end": [], "tokens": []}
        vectors = []
        pad_id = self.encoder.tokenizer.pad_token_id
        for rows in plan_batches([len(x) for x in ids], self.max_tokens, len(ids)):
            input_ids, mask = pad_batch([ids[i] for i in rows], pad_id)
            if self.chunk_tokens is None:
                pooled = self.encoder.pooled(input_ids, mask).float()
                vectors.append(quantize(truncate(pooled, self.dim), self.quantization))
                out["content_hash"] += [hashes[i] for i in rows]
                out["chunk"] += [0] * len(rows)
                out["start"] += [0] * len(rows)
                out["end"] += [-1] * len(rows)
                out["tokens"] += [len(ids[i]) for i in rows]
                continue
            states = self.encoder.token_states(input_ids, mask).float()
            for row, index in enumerate(rows):
                spans = chunk_spans(
                    np.asarray(offsets[index], dtype=np.int32).reshape(-1, 2), self.chunk_tokens
                )
                pooled = torch.stack(
                    [mean_pool(states[row : row + 1, pos], torch.ones(1, len(pos)))[0] for pos, _, _ in spans]
                )
                vectors.append(quantize(truncate(pooled, self.dim), self.quantization))
                for chunk, (_, start, end) in enumerate(spans):
                    out["content_hash"].append(hashes[index])
                    out["chunk"].append(chunk)
                    out["start"].append(start)
                    out["end"].append(end)
                    out["tokens"].append(len(ids[index]))
        table = {k: pa.array(v, pa.string() if k == "content_hash" else pa.int32()) for k, v in out.items()}
        table["vector"] = vectors_column(np.concatenate(vectors) if vectors else np.zeros((0, 1), np.float32))
        return pa.table(table)


def sparse_columns(matrix: sp.csr_matrix) -> dict[str, pa.Array]:
    """A CSR matrix as ``sparse_ids`` / ``sparse_weights`` list columns (one row per matrix row)."""
    bounds = list(zip(matrix.indptr[:-1], matrix.indptr[1:], strict=True))
    return {
        "sparse_ids": pa.array([matrix.indices[a:b] for a, b in bounds], pa.list_(pa.int32())),
        "sparse_weights": pa.array([matrix.data[a:b] for a, b in bounds], pa.list_(pa.float32())),
    }


def sparse_matrix(ids: pa.ChunkedArray | pa.Array, weights: pa.ChunkedArray | pa.Array, vocab_size: int) -> sp.csr_matrix:
    """The inverse of ``sparse_columns``."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    weights = weights.combine_chunks() if isinstance(weights, pa.ChunkedArray) else weights
    indptr = np.array(ids.offsets.to_numpy(), dtype=np.int64)
    indptr -= indptr[0]
    data = np.array(weights.flatten().to_numpy(zero_copy_only=False), np.float32)  # copies: arrow is read-only
    indices = np.array(ids.flatten().to_numpy(zero_copy_only=False), np.int32)
    return sp.csr_matrix((data, indices, indptr), shape=(len(ids), vocab_size))


class RepresentativeActor:
    """One diffusion LM per actor: documents -> K_p mask-position vectors and a sparse term vector each."""

    def __init__(
        self,
        model: str,
        k_passage: int,
        top_terms: int,
        max_tokens_per_batch: int,
        torch_threads: int | None,
        device: str | None,
        dtype: str | None,
    ):
        from embedlib.encoding.representative_tokens import DiffRetrieverEncoder

        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.encoder = DiffRetrieverEncoder.from_pretrained(model, device=device, dtype=dtype, top_terms=top_terms)
        self.k, self.max_tokens = k_passage, max_tokens_per_batch

    def __call__(self, batch: pa.Table) -> pa.Table:
        titles, bodies = batch.column("title").to_pylist(), batch.column("text").to_pylist()
        texts = [embedded_text(ti or "", te) for ti, te in zip(titles, bodies, strict=True)]
        prompts, _ = self.encoder.masked_prompts(texts, self.k, "passage")
        found = self.encoder.encode(texts, k=self.k, kind="passage", max_tokens_per_batch=self.max_tokens)
        rows = len(texts)
        dense = np.stack(found.dense).reshape(rows, -1) if rows else np.zeros((0, self.k * self.encoder.dim))
        return pa.table(
            {
                "content_hash": batch.column("content_hash").cast(pa.string()),
                "chunk": pa.array([0] * rows, pa.int32()),
                "start": pa.array([0] * rows, pa.int32()),
                "end": pa.array([-1] * rows, pa.int32()),
                "tokens": pa.array([len(p) for p in prompts], pa.int32()),
                "vector": vectors_column(dense.astype(np.float32)),
                **sparse_columns(found.sparse),
            }
        )


def default_torch_threads(cfg: IndexJobConfig) -> int:
    """Cores per actor when not configured: the node's cores shared by the actors."""
    return cfg.torch_threads or max(1, (os.cpu_count() or 1) // cfg.actors)


def encode_rows(rows: ray.data.Dataset, cfg: IndexJobConfig, model: str) -> ray.data.Dataset:
    """``content_hash, title, text`` rows -> encoded rows (lazy; the caller writes them)."""
    rows = rows.repartition(target_num_rows_per_block=cfg.batch_rows)  # parts land every batch_rows rows
    pool = dict(
        batch_format="pyarrow",
        batch_size=cfg.batch_rows,
        compute=ray.data.ActorPoolStrategy(size=cfg.actors),
        num_cpus=cfg.cpus_per_actor,
        num_gpus=cfg.gpus_per_actor,
    )
    actor = dict(
        model=model,
        max_tokens_per_batch=cfg.max_tokens_per_batch,
        torch_threads=None if cfg.gpus_per_actor else default_torch_threads(cfg),
        device=cfg.device,
        dtype=cfg.dtype,
    )
    if cfg.method == "diffretriever":
        return rows.map_batches(
            RepresentativeActor,
            fn_constructor_kwargs=dict(actor, k_passage=cfg.k_passage, top_terms=cfg.top_terms),
            **pool,
        )
    # Tokenization asks for fewer CPUs than the actors, so Ray Data runs it as separate tasks (no fusion).
    tokens = rows.map_batches(
        tokenize_batch,
        batch_format="numpy",
        batch_size=cfg.batch_rows,
        num_cpus=0.25,
        fn_kwargs=dict(model=model, chunked=cfg.chunk_tokens is not None),
    )  # CPU tasks
    return tokens.map_batches(
        EncoderActor,
        fn_constructor_kwargs=dict(
            actor, quantization=cfg.quantization, dim=cfg.dim, chunk_tokens=cfg.chunk_tokens
        ),
        **pool,
    )
