"""Gathering embeddings across data-parallel workers for in-batch negatives."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Concatenate ``local`` from every rank (rank order); gradients flow to this rank's own slice.

    Other ranks' slices are constants here: each rank back-propagates its own part, and the data-parallel
    gradient all-reduce sums the contributions (the usual trick of CLIP/GTE training). Local-only when
    torch.distributed is not initialised. Every rank must pass the same shape.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.detach().contiguous())
    parts[dist.get_rank()] = local
    return torch.cat(parts, dim=0)


def rank_offset(local_size: int) -> int:
    """Index of this rank's first row in a gathered tensor of equally sized per-rank parts."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank() * local_size
