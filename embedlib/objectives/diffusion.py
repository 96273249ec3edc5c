"""Masked diffusion continued pretraining (pplx-embed §4.2, after Gong et al. 2025, "Scaling diffusion LMs").

Per sequence ``t ~ U(t_min, 1)``; every real token is replaced by the mask token with probability ``t``;
the loss is the cross-entropy on masked positions only, weighted by ``1/t`` (the ELBO) and normalised by
the sequence length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

T_MIN = 0.001


def mask_for_diffusion(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask_id: int,
    generator: torch.Generator | None = None,
    t_min: float = T_MIN,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(noisy_ids, masked, t)``: ids with masked positions replaced, the bool mask ``(B, L)``, ``t`` ``(B,)``."""
    batch, length = input_ids.shape
    t = torch.rand(batch, generator=generator, device=input_ids.device) * (1.0 - t_min) + t_min
    draws = torch.rand(batch, length, generator=generator, device=input_ids.device)
    masked = (draws < t[:, None]) & attention_mask.bool()
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    return noisy, masked, t


def diffusion_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    masked: torch.Tensor,
    t: torch.Tensor,
    attention_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, masked_accuracy)``: mean over sequences of ``Σ_masked CE / t / length``."""
    token_ce = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")  # (B, L)
    lengths = attention_mask.sum(dim=1).clamp(min=1).to(token_ce.dtype)
    per_sequence = (token_ce * masked).sum(dim=1) / t / lengths
    with torch.no_grad():
        correct = (logits.argmax(dim=-1) == targets) & masked
        accuracy = correct.sum() / masked.sum().clamp(min=1)
    return per_sequence.mean(), accuracy
