"""embedlib: web-scale text embedding and indexing on diffusion-pretrained bidirectional encoders.

``Encoder`` and ``CheckpointError`` load on first use, so that Ray workers which only read, write or search
vectors never import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedlib.encoding.encoder import Encoder
    from embedlib.models.loading import CheckpointError

__all__ = ["CheckpointError", "Encoder"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Encoder":
        from embedlib.encoding.encoder import Encoder

        return Encoder
    if name == "CheckpointError":
        from embedlib.models.loading import CheckpointError

        return CheckpointError
    raise AttributeError(f"module 'embedlib' has no attribute {name!r}")
