"""Models stage: bidirectional backbones, checkpoint loading and tiny test models."""
