"""embedlib: web-scale text embedding and indexing on diffusion-pretrained bidirectional encoders."""

from embedlib.encoding.encoder import Encoder
from embedlib.models.loading import CheckpointError

__all__ = ["CheckpointError", "Encoder"]
__version__ = "0.1.0"
