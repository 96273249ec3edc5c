"""Training objectives, each as published (pplx-embed §4.2-§4.6)."""

from embedlib.objectives.contrastive import (
    contextual_beta,
    contextual_loss,
    embed_int8,
    false_negative_mask,
    info_nce,
    matryoshka,
    pair_loss,
    triplet_loss,
)
from embedlib.objectives.diffusion import diffusion_loss, mask_for_diffusion
from embedlib.objectives.distributed import all_gather_with_grad

__all__ = [
    "all_gather_with_grad",
    "contextual_beta",
    "contextual_loss",
    "diffusion_loss",
    "embed_int8",
    "false_negative_mask",
    "info_nce",
    "mask_for_diffusion",
    "matryoshka",
    "pair_loss",
    "triplet_loss",
]
