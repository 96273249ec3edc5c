"""SLERP merging of two checkpoints of the same architecture, tensor by tensor."""

from __future__ import annotations

import os

import torch

from embedlib.encoding.encoder import Encoder
from embedlib.training.config import MergeConfig
from embedlib.training.recipe import write_recipe

PARALLEL_DOT = 0.9995  # |cos| above this: the arc is degenerate, interpolate linearly


def slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation between two tensors (treated as flat vectors); linear when nearly parallel."""
    if a.shape != b.shape:
        raise ValueError(f"cannot merge tensors of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if not a.is_floating_point():
        return a.clone() if t < 0.5 else b.clone()
    x, y = a.flatten().double(), b.flatten().double()
    norm_x, norm_y = x.norm(), y.norm()
    if norm_x == 0 or norm_y == 0:
        return torch.lerp(a.double(), b.double(), t).to(a.dtype)
    dot = torch.clamp(torch.dot(x / norm_x, y / norm_y), -1.0, 1.0)
    if dot.abs() > PARALLEL_DOT:
        return torch.lerp(a.double(), b.double(), t).to(a.dtype)
    theta = torch.arccos(dot)
    sin_theta = torch.sin(theta)
    merged = (torch.sin((1 - t) * theta) / sin_theta) * x + (torch.sin(t * theta) / sin_theta) * y
    return merged.view_as(a).to(a.dtype)


def slerp_state_dicts(
    first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], t: float
) -> dict[str, torch.Tensor]:
    """Per-tensor SLERP of two state dicts with the same keys."""
    if set(first) != set(second):
        missing = sorted(set(first) ^ set(second))
        raise ValueError(f"checkpoints differ in tensors: {missing[:5]}")
    return {name: slerp(first[name], second[name], t) for name in first}


def merge_checkpoints(
    first: str | os.PathLike, second: str | os.PathLike, output: str | os.PathLike, t: float = 0.5
) -> Encoder:
    """SLERP ``first`` (t=0) towards ``second`` (t=1) and save the result with ``Encoder.save_pretrained``."""
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"t: must be in [0, 1], got {t}")
    base = Encoder.from_pretrained(first, device="cpu", dtype="fp32")
    other = Encoder.from_pretrained(second, device="cpu", dtype="fp32")
    base.model.load_state_dict(slerp_state_dicts(base.model.state_dict(), other.model.state_dict(), t))
    base.save_pretrained(output)
    write_recipe(output, MergeConfig(first=str(first), second=str(second), output=str(output), t=t))
    return base
