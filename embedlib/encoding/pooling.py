"""Pooling as data: how token states become one vector, named as sentence-transformers' ``Pooling`` names it.

``mean`` over real tokens is the recipe (pplx-embed); ``last_token`` is the causal-decoder ablation's. The
mode is saved in the checkpoint's ``1_Pooling/config.json``, so a model is read back the way it was trained.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embedlib.encoding.quantize import mean_pool

POOLING_MODES = ("mean", "last_token")


def last_token_pool(token_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The state of each sequence's last real token (right padding): ``(B, L, d) -> (B, d)``."""
    last = attention_mask.sum(dim=1).clamp(min=1) - 1
    return token_states[torch.arange(token_states.shape[0], device=token_states.device), last]


@dataclass(frozen=True)
class Pooling:
    """One of ``POOLING_MODES``; calling it pools ``(B, L, d)`` token states over ``attention_mask``."""

    mode: str = "mean"

    def __post_init__(self) -> None:
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling: mode must be one of {POOLING_MODES}, got {self.mode!r}")

    def __call__(self, token_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.to(token_states.device)
        if self.mode == "last_token":
            return last_token_pool(token_states, mask)
        return mean_pool(token_states, mask)
