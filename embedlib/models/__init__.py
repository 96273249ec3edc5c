"""Models stage: bidirectional backbones, checkpoint loading and tiny test models."""

from embedlib.models import bidirectional as _bidirectional  # noqa: F401  (registers the auto classes)
