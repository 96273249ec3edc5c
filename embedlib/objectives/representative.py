"""DiffRetriever contrastive objective: InfoNCE on the dense MaxSim and on the sparse term-weight dot product.

Inputs are what one bidirectional pass reads at the K mask positions: states ``(n, K, h)`` and LM-head logits
``(n, K, V)``. The passages of a batch are each query's positive followed by any hard negatives; every
passage of every data-parallel rank is a negative for every query, except the query's own positive and
copies of it (equal content hash).

- Dense: MaxSim (unit rows, each query vector's best dot product) divided by ``k_query``, so the score lies in
  [-1, 1] like a cosine and the temperature does not depend on K. Search clamps each best dot product at 0;
  training does not, because the clamp zeroes the gradient of a query vector that every passage vector
  opposes, and InfoNCE on near-identical (anisotropic) states drives the vectors there and stalls at chance.
- Sparse: ``log(1 + ReLU(logits))`` max-pooled over K (special ids zeroed, no top-k truncation), dot product,
  on the raw scale (SPLADE's temperature 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embedlib.encoding.representative_tokens import term_weights
from embedlib.objectives.contrastive import info_nce, not_self, same_document
from embedlib.objectives.distributed import all_gather_with_grad, rank_offset

DIFFRETRIEVER_TEMPERATURE = 0.05  # dense: on MaxSim / k_query, a cosine scale
SPARSE_TEMPERATURE = 1.0


def maxsim_matrix(queries: torch.Tensor, passages: torch.Tensor) -> torch.Tensor:
    """MaxSim / Kq ``(B, N)`` of queries ``(B, Kq, h)`` against passages ``(N, Kp, h)`` (rows unit-normalised,
    no clamp: see the module docstring)."""
    q = F.normalize(queries.float(), dim=-1)
    p = F.normalize(passages.float(), dim=-1)
    similarities = torch.einsum("bqh,nph->bnqp", q, p)
    return similarities.amax(dim=-1).mean(dim=-1)


def sparse_similarity(queries: torch.Tensor, passages: torch.Tensor) -> torch.Tensor:
    """Dot products ``(B, N)`` of query term weights ``(B, V)`` and passage term weights ``(N, V)``."""
    return queries @ passages.T


def passage_nce(
    scores: torch.Tensor, local_passages: int, passage_hashes: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """InfoNCE of ``scores (B, N)`` over every rank's passages (``local_passages`` per rank, positives first).

    Query ``i``'s positive is row ``i`` of its own rank's passages; ``passage_hashes`` ``(local_passages,)``:
    passages equal to a query's positive are not negatives.
    """
    rows = scores.shape[0]
    offset = rank_offset(local_passages)
    index = torch.arange(rows, device=scores.device)
    keep = not_self(rows, scores.shape[1], offset, scores.device)
    if passage_hashes is not None:
        keep &= ~same_document(passage_hashes[:rows], all_gather_with_grad(passage_hashes))
    return info_nce(scores[index, offset + index], scores, keep, temperature)


def diffretriever_loss(
    query_states: torch.Tensor,
    query_logits: torch.Tensor,
    passage_states: torch.Tensor,
    passage_logits: torch.Tensor,
    temperature: float = DIFFRETRIEVER_TEMPERATURE,
    sparse_weight: float = 1.0,
    passage_hashes: torch.Tensor | None = None,
    excluded: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``dense + sparse_weight · sparse`` InfoNCE; passages ``(n, ...)`` are the B positives, then negatives.

    Returns ``{"loss", "dense_loss", "sparse_loss"}``.
    """
    dense_scores = maxsim_matrix(query_states, all_gather_with_grad(passage_states))
    local = passage_states.shape[0]
    dense = passage_nce(dense_scores, local, passage_hashes, temperature)
    query_weights = term_weights(query_logits, excluded)
    passage_weights = all_gather_with_grad(term_weights(passage_logits, excluded))
    sparse_scores = sparse_similarity(query_weights, passage_weights)
    sparse = passage_nce(sparse_scores, local, passage_hashes, SPARSE_TEMPERATURE)
    loss = dense + sparse_weight * sparse
    return {"loss": loss, "dense_loss": dense.detach(), "sparse_loss": sparse.detach()}

