"""Token-budget batching: texts sorted by length, each batch padded to at most ``max_tokens`` cells."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def plan_batches(lengths: Sequence[int], max_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Group indices into batches, longest first, so that ``len(batch) * longest <= max_tokens``.

    A single sequence longer than the budget still gets a batch of its own.
    """
    if max_tokens < 1 or max_batch_size < 1:
        raise ValueError(f"max_tokens and max_batch_size must be >= 1, got {max_tokens}, {max_batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = lengths[current[0]] if current else lengths[index]
        if current and ((len(current) + 1) * longest > max_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def pad_batch(token_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id lists into ``(input_ids, attention_mask)`` tensors."""
    width = max((len(ids) for ids in token_ids), default=0)
    input_ids = torch.full((len(token_ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(token_ids), width), dtype=torch.long)
    for row, ids in enumerate(token_ids):
        input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask
