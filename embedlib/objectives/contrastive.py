"""Contrastive objectives on INT8 straight-through embeddings (pplx-embed §4.3-§4.6).

All similarities are cosines between ``round(127·tanh(x))`` codes (gradients through ``127·tanh``), after
Matryoshka truncation. Shapes: ``q``/``d`` are this rank's ``(B, d)`` pooled float vectors; negatives are
gathered from every data-parallel rank (:func:`all_gather_with_grad`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from embedlib.encoding.quantize import binary_straight_through, int8_straight_through, truncate
from embedlib.objectives.distributed import all_gather_with_grad, rank_offset

PAIR_TEMPERATURE = 0.02
TRIPLET_TEMPERATURE = 0.03
FALSE_NEGATIVE_MARGIN = 0.1
CONTEXTUAL_ALPHA = 0.2
CONTEXTUAL_BETA = (0.2, 0.5)


def embed_int8(pooled: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Training-time embedding: Matryoshka truncation, then INT8 straight-through."""
    return int8_straight_through(truncate(pooled, dim))


def embed_binary(pooled: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Training-time binary embedding: Matryoshka truncation, then sign straight-through."""
    return binary_straight_through(truncate(pooled, dim))


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of ``a (..., d)`` against ``b (..., d)`` with broadcasting over the last axis."""
    return (F.normalize(a.float(), dim=-1) * F.normalize(b.float(), dim=-1)).sum(dim=-1)


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise cosines ``(n, m)`` between the rows of ``a`` and ``b``."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def false_negative_mask(
    negative_scores: torch.Tensor, positive_scores: torch.Tensor, margin: float = FALSE_NEGATIVE_MARGIN
) -> torch.Tensor:
    """``m_i(x) = 1{s(q_i, x) ≤ s(q_i, d_i) + margin}``: which negatives to keep (bool, shape of scores)."""
    return negative_scores <= positive_scores.unsqueeze(-1) + margin


def info_nce(
    positive: torch.Tensor, negatives: torch.Tensor, keep: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """Mean of ``-log(e^{s+/τ} / (e^{s+/τ} + Σ_keep e^{s-/τ}))``; ``positive (B,)``, ``negatives (B, N)``."""
    logits = torch.cat([positive.unsqueeze(1), negatives], dim=1) / temperature
    if keep is not None:
        always = torch.ones_like(positive, dtype=torch.bool).unsqueeze(1)
        logits = logits.masked_fill(~torch.cat([always, keep], dim=1), float("-inf"))
    return -(logits[:, 0] - torch.logsumexp(logits, dim=1)).mean()


def not_self(rows: int, columns: int, offset: int, device: torch.device) -> torch.Tensor:
    """Bool ``(rows, columns)``: False where column ``offset + row`` (a query's own pair in the gather)."""
    keep = torch.ones(rows, columns, dtype=torch.bool, device=device)
    keep[torch.arange(rows, device=device), offset + torch.arange(rows, device=device)] = False
    return keep


def same_document(local_hashes: torch.Tensor, all_hashes: torch.Tensor) -> torch.Tensor:
    """Bool ``(B, N)``: the in-batch document is the same document (equal content hash) as the query's own."""
    return local_hashes.unsqueeze(1) == all_hashes.unsqueeze(0)


def query_document_nce(
    q: torch.Tensor,
    d: torch.Tensor,
    temperature: float,
    margin: float | None,
    doc_hashes: torch.Tensor | None = None,
    query_negatives: bool = True,
    in_batch_keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """InfoNCE of each query against its document, with every rank's documents (and queries) as negatives.

    ``margin``: the false-negative mask (``None`` turns it off); ``doc_hashes`` ``(B,)`` int64: in-batch
    copies of a query's own document are not negatives (the duplicate-document mask); ``in_batch_keep``
    ``(B, N)`` bool over the gathered rows: which may be negatives at all (:func:`same_source_other_query`).
    """
    all_d = all_gather_with_grad(d)
    offset = rank_offset(q.shape[0])
    positive = cosine(q, d)
    keep_self = not_self(q.shape[0], all_d.shape[0], offset, q.device)
    doc_scores = cosine_matrix(q, all_d)
    if in_batch_keep is not None:
        keep_self = keep_self & in_batch_keep
    doc_keep = keep_self.clone()
    if doc_hashes is not None:
        doc_keep &= ~same_document(doc_hashes, all_gather_with_grad(doc_hashes))
    scores, keep = [doc_scores], [doc_keep]
    if query_negatives:
        scores.append(cosine_matrix(q, all_gather_with_grad(q)))
        keep.append(keep_self)
    scores_t, keep_t = torch.cat(scores, dim=1), torch.cat(keep, dim=1)
    if margin is not None:
        keep_t &= false_negative_mask(scores_t, positive, margin)
    return info_nce(positive, scores_t, keep_t, temperature)


def both(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """``a & b`` where either may be ``None`` (no restriction)."""
    if a is None or b is None:
        return a if b is None else b
    return a & b


def same_source_other_query(
    sources: torch.Tensor | None, queries: torch.Tensor | None
) -> torch.Tensor | None:
    """Bool ``(B, N)`` over every rank's rows: in-batch negatives come from the query's own source (by hash)
    and never from a row of the same query (its other positives); ``None`` when the rows carry neither."""
    same_source = None if sources is None else sources.unsqueeze(1) == all_gather_with_grad(sources).unsqueeze(0)
    other_query = None if queries is None else queries.unsqueeze(1) != all_gather_with_grad(queries).unsqueeze(0)
    return both(same_source, other_query)


def not_judged_relevant(relevant_keys: torch.Tensor | None, doc_keys: torch.Tensor | None) -> torch.Tensor | None:
    """Bool ``(B, N)``: the gathered row's positive is not among the documents judged relevant to this row's
    query. ``relevant_keys (B, R)`` hashes of those documents (padded with any of them), ``doc_keys (B,)`` the
    hash of each row's positive; ``None`` when the rows carry no judgements."""
    if relevant_keys is None or doc_keys is None:
        return None
    all_keys = all_gather_with_grad(doc_keys)
    return ~(relevant_keys.unsqueeze(-1) == all_keys.view(1, 1, -1)).any(dim=1)


def pair_loss(
    q: torch.Tensor,
    d: torch.Tensor,
    temperature: float = PAIR_TEMPERATURE,
    margin: float | None = FALSE_NEGATIVE_MARGIN,
    doc_hashes: torch.Tensor | None = None,
    in_batch_keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pair training (§4.4): in-batch documents and other queries as negatives, false-negative mask."""
    return query_document_nce(q, d, temperature, margin, doc_hashes, query_negatives=True,
                              in_batch_keep=in_batch_keep)


def triplet_loss(
    q: torch.Tensor,
    d: torch.Tensor,
    hard_negatives: torch.Tensor,
    temperature: float = TRIPLET_TEMPERATURE,
    in_batch_keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triplet training (§4.6): in-batch documents plus each query's own ``K`` hard negatives ``(B, K, d)``;
    ``in_batch_keep`` as in :func:`query_document_nce`."""
    all_d = all_gather_with_grad(d)
    offset = rank_offset(q.shape[0])
    in_batch = cosine_matrix(q, all_d)
    keep_in_batch = not_self(q.shape[0], all_d.shape[0], offset, q.device)
    if in_batch_keep is not None:
        keep_in_batch &= in_batch_keep
    keep = torch.cat(
        [keep_in_batch, torch.ones(hard_negatives.shape[:2], dtype=torch.bool, device=q.device)], dim=1
    )
    hard = cosine(q.unsqueeze(1), hard_negatives)
    return info_nce(cosine(q, d), torch.cat([in_batch, hard], dim=1), keep, temperature)


def contextual_beta(
    progress: float, start: float = CONTEXTUAL_BETA[0], end: float = CONTEXTUAL_BETA[1]
) -> float:
    """β rising from ``start`` to ``end`` on a half-cosine over training ``progress`` in [0, 1]."""
    progress = min(max(progress, 0.0), 1.0)
    return start + (end - start) * (1.0 - math.cos(math.pi * progress)) / 2.0


def contextual_local(
    q: torch.Tensor,
    chunks: torch.Tensor,
    chunk_valid: torch.Tensor,
    gold: torch.Tensor,
    temperature: float,
    alpha: float = CONTEXTUAL_ALPHA,
) -> torch.Tensor:
    """``α·L_seq + (1-α)·L_batch``: the gold chunk against the document's other chunks / every batch chunk.

    ``chunks (B, C, d)`` with ``chunk_valid (B, C)`` (padding chunks are never negatives), ``gold (B,)``.
    """
    rows = torch.arange(q.shape[0], device=q.device)
    positive = cosine(q, chunks[rows, gold])
    own = cosine(q.unsqueeze(1), chunks)
    own_keep = chunk_valid.clone()
    own_keep[rows, gold] = False
    seq = info_nce(positive, own, own_keep, temperature)
    all_chunks = all_gather_with_grad(chunks).flatten(0, 1)
    all_valid = all_gather_with_grad(chunk_valid.to(torch.uint8)).flatten().bool()
    batch_scores = cosine_matrix(q, all_chunks)
    batch_keep = all_valid.unsqueeze(0).expand_as(batch_scores).clone()
    offset = rank_offset(q.shape[0])
    batch_keep[rows, (offset + rows) * chunks.shape[1] + gold] = False
    batch = info_nce(positive, batch_scores, batch_keep, temperature)
    return alpha * seq + (1.0 - alpha) * batch


def contextual_loss(
    q: torch.Tensor,
    doc: torch.Tensor,
    chunks: torch.Tensor,
    chunk_valid: torch.Tensor,
    gold: torch.Tensor,
    doc_hashes: torch.Tensor,
    beta: float,
    temperature: float = PAIR_TEMPERATURE,
    alpha: float = CONTEXTUAL_ALPHA,
    margin: float | None = FALSE_NEGATIVE_MARGIN,
) -> torch.Tensor:
    """Contextual training (§4.5): ``β·L_global + (1-β)·L_local``.

    ``L_global``: query-document InfoNCE with the duplicate-document mask, the false-negative mask and
    query-query negatives; ``L_local``: :func:`contextual_local` on late-chunked chunk embeddings.
    """
    global_loss = query_document_nce(q, doc, temperature, margin, doc_hashes, query_negatives=True)
    local_loss = contextual_local(q, chunks, chunk_valid, gold, temperature, alpha)
    return beta * global_loss + (1.0 - beta) * local_loss


def anchor_loss(pooled: Sequence[torch.Tensor], anchored: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean ``1 - cos`` between each embedding and the starting model's on the same text (the forgetting guard)."""
    return torch.stack([(1.0 - cosine(p, a)).mean() for p, a in zip(pooled, anchored, strict=True)]).mean()


def matryoshka(
    loss: Callable[..., torch.Tensor],
    pooled: Sequence[torch.Tensor],
    dims: Sequence[int | None] | None,
    binary_weight: float = 0.0,
) -> torch.Tensor:
    """Sum of ``loss(*int8 embeddings)`` over the nested ``dims`` (``None``/empty: the full width only), plus
    ``binary_weight`` times the same loss on sign straight-through embeddings at each width."""
    dims = list(dims) if dims else [None]
    total = sum(loss(*(embed_int8(p, dim) for p in pooled)) for dim in dims)
    if binary_weight:
        total = total + binary_weight * sum(loss(*(embed_binary(p, dim) for p in pooled)) for dim in dims)
    return total
