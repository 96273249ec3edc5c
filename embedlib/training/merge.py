"""Merging two checkpoints of the same architecture tensor by tensor (SLERP or linear), and the sweep that
chooses the weight on held-out dev queries (WiSE-FT-style interpolation against forgetting)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Literal

import torch

from embedlib.encoding.encoder import Encoder
from embedlib.eval.beir import BeirDataset
from embedlib.eval.metrics import paired_bootstrap
from embedlib.training.config import MergeConfig
from embedlib.training.recipe import write_recipe

PARALLEL_DOT = 0.9995  # |cos| above this: the arc is degenerate, interpolate linearly
Method = Literal["slerp", "linear"]
LayerScaling = Literal["none", "linear"]
GuardRule = Literal["score", "bootstrap"]
LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")  # BERT's encoder.layer.<i>., Qwen's layers.<i>.


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


def lerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """``(1 - t)·a + t·b`` (integer tensors: the nearer end's)."""
    if a.shape != b.shape:
        raise ValueError(f"cannot merge tensors of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if not a.is_floating_point():
        return a.clone() if t < 0.5 else b.clone()
    return torch.lerp(a.double(), b.double(), t).to(a.dtype)


def depth_shares(names: Iterable[str], layer_scaling: LayerScaling = "none") -> dict[str, float]:
    """The share of ``t`` each tensor moves: 1 for all with ``"none"``. With ``"linear"`` (LiNeS, Wang et al.
    2024: the shallow layers hold the general features that fine-tuning should not move), layer ``i`` of ``L``
    moves ``i / (L - 1)``, the embeddings 0 and what follows the last layer (final norm, pooler) 1."""
    names = list(names)
    if layer_scaling == "none":
        return dict.fromkeys(names, 1.0)
    layers = {name: int(match.group(1)) for name in names if (match := LAYER_INDEX.search(name))}
    if not layers:
        raise ValueError("layer_scaling: no tensor is named like a layer (layers.<i>. or layer.<i>.)")
    last = max(layers.values())
    shares = {}
    for name in names:
        if name in layers:
            shares[name] = layers[name] / last if last else 1.0
        else:
            shares[name] = 0.0 if "embed" in name else 1.0
    return shares


def interpolate_state_dicts(
    first: dict[str, torch.Tensor],
    second: dict[str, torch.Tensor],
    t: float,
    method: Method = "slerp",
    layer_scaling: LayerScaling = "none",
) -> dict[str, torch.Tensor]:
    """Per-tensor SLERP or linear interpolation of two state dicts with the same keys, each tensor at
    ``t`` times its ``depth_shares`` share."""
    if set(first) != set(second):
        missing = sorted(set(first) ^ set(second))
        raise ValueError(f"checkpoints differ in tensors: {missing[:5]}")
    merge = slerp if method == "slerp" else lerp
    shares = depth_shares(first, layer_scaling)
    return {name: merge(first[name], second[name], t * shares[name]) for name in first}


def merged_encoder(
    first: str | os.PathLike,
    second: Encoder,
    t: float,
    method: Method = "slerp",
    max_length: int | None = None,
    layer_scaling: LayerScaling = "none",
) -> Encoder:
    """``first`` loaded and moved ``t`` of the way to ``second``'s weights (a fresh encoder: its own weights hash,
    and no binary centre: either model's was fitted on other weights)."""
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"t: must be in [0, 1], got {t}")
    encoder = Encoder.from_pretrained(first, device="cpu", dtype="fp32", max_length=max_length)
    weights = interpolate_state_dicts(encoder.model.state_dict(), second.model.state_dict(), t, method, layer_scaling)
    encoder.model.load_state_dict(weights)
    encoder.backbone.binary_centre = None
    return encoder


def merge_checkpoints(
    first: str | os.PathLike,
    second: str | os.PathLike,
    output: str | os.PathLike,
    t: float = 0.5,
    method: Method = "slerp",
    layer_scaling: LayerScaling = "none",
) -> Encoder:
    """Interpolate ``first`` (t=0) towards ``second`` (t=1) and save the result with ``Encoder.save_pretrained``."""
    other = Encoder.from_pretrained(second, device="cpu", dtype="fp32")
    merged = merged_encoder(first, other, t, method, layer_scaling=layer_scaling)
    merged.save_pretrained(output)
    write_recipe(output, MergeConfig(first=str(first), second=str(second), output=str(output), t=t, method=method,
                                     layer_scaling=layer_scaling))
    return merged


def dev_score(
    encoder: Encoder, name: str, dataset: BeirDataset, q2q: bool, quantization: str, cache: str | None
) -> float:
    """nDCG@10 (Q2D) or recall@10 (Q2Q) of ``encoder`` on a dev set through the served ``quantization`` path."""
    return dev_result(encoder, name, dataset, q2q, quantization, cache)[0]


def dev_result(
    encoder: Encoder, name: str, dataset: BeirDataset, q2q: bool, quantization: str, cache: str | None
) -> tuple[float, dict[str, float]]:
    """``dev_score`` and each query's value of it (query id -> score)."""
    from embedlib.eval.run import evaluate_systems
    from embedlib.eval.systems import DenseSystem, ModelEmbeddings

    system = DenseSystem(ModelEmbeddings(name, encoder, cache=cache, show_progress=False), quantization)
    result = evaluate_systems(dataset, [system], q2q=q2q, max_k=10)[0]
    metric = "recall@10" if q2q else "ndcg@10"
    return result.metrics[metric], {qid: row[metric] for qid, row in result.per_query.items()}


def sweep(
    first: str | os.PathLike,
    second: str | os.PathLike,
    weights: Sequence[float],
    dev_sets: dict[str, tuple[BeirDataset, bool]],
    method: Method = "slerp",
    max_length: int | None = None,
    quantization: str = "int8",
    cache: str | None = None,
    guard_sets: dict[str, tuple[BeirDataset, bool]] | None = None,
    layer_scaling: LayerScaling = "none",
) -> list[dict]:
    """One point per weight: ``{"t", "scores": {dev set: score}, "mean"}``, plus ``"guard": {guard set: score}``
    and ``"guard_per_query": {guard set: {query id: score}}`` with ``guard_sets``; both map a name to
    ``(dataset, is_q2q)``."""
    other = Encoder.from_pretrained(second, device="cpu", dtype="fp32")
    curve = []
    for t in weights:
        encoder = merged_encoder(first, other, t, method, max_length, layer_scaling)
        point = {"t": t, "scores": dev_scores(encoder, t, dev_sets, quantization, cache)}
        point["mean"] = sum(point["scores"].values()) / len(point["scores"])
        if guard_sets:
            point |= guard_scores(encoder, t, guard_sets, quantization, cache)
        curve.append(point)
    return curve


def dev_scores(
    encoder: Encoder, t: float, sets: dict[str, tuple[BeirDataset, bool]], quantization: str, cache: str | None
) -> dict[str, float]:
    return {
        name: dev_score(encoder, f"merge@{t:g}/{name}", dataset, q2q, quantization, cache)
        for name, (dataset, q2q) in sets.items()
    }


def guard_scores(
    encoder: Encoder, t: float, guard_sets: dict[str, tuple[BeirDataset, bool]], quantization: str, cache: str | None
) -> dict[str, dict]:
    """A sweep point's guard entries for ``encoder`` (merged at ``t``): ``{"guard": {set: score},
    "guard_per_query": {set: {query id: score}}}``."""
    results = {name: dev_result(encoder, f"merge@{t:g}/{name}", dataset, q2q, quantization, cache)
               for name, (dataset, q2q) in guard_sets.items()}
    return {"guard": {name: score for name, (score, _) in results.items()},
            "guard_per_query": {name: per_query for name, (_, per_query) in results.items()}}


def best_weight(curve: Sequence[dict], keep_gain: float | None = None, guard_tolerance: float = 0.0,
                guard_rule: GuardRule = "score") -> float:
    """The weight of the best mean dev score (the smaller weight on a tie: closer to ``first``).

    ``keep_gain``: instead, the smallest weight whose mean dev gain over ``first`` (the t = 0 point) is at least
    this fraction of the best gain: as close to ``first`` as possible while keeping that share of what training
    added on the dev sets (t = 0 when nothing was gained).

    Points with ``"guard"`` scores cap the result at ``guard_limit``.
    """
    best = max(curve, key=lambda point: (point["mean"], -point["t"]))
    start = next((point for point in curve if point["t"] == 0.0), None)
    if keep_gain is None or start is None:
        chosen = best["t"]
    elif best["mean"] <= start["mean"]:
        chosen = 0.0
    else:
        gain = best["mean"] - start["mean"]
        chosen = min(p["t"] for p in curve if p["mean"] - start["mean"] >= keep_gain * gain)
    if any("guard" in point for point in curve):
        chosen = min(chosen, guard_limit(curve, guard_tolerance, guard_rule))
    return chosen


def guard_change(start: dict, point: dict, name: str) -> tuple[float, float, float]:
    """Guard set ``name``'s mean per-query change from ``start`` (t = 0) to ``point``, and its 95% interval
    (paired bootstrap over the guard queries)."""
    if "guard_per_query" not in point or "guard_per_query" not in start:
        raise ValueError("guard_rule bootstrap needs each point's per-query guard scores (guard_per_query): "
                         "sweep them again with this version of embedlib.training.merge.sweep")
    return paired_bootstrap(start["guard_per_query"][name], point["guard_per_query"][name])


def guard_falls(start: dict, point: dict, name: str, tolerance: float, rule: GuardRule) -> bool:
    """Whether guard set ``name`` falls from ``start`` to ``point``: by ``rule`` "score", its score is more than
    ``tolerance`` below; by "bootstrap", the whole 95% interval of its change lies more than ``tolerance`` below
    zero (a fall that the guard queries' sampling does not explain)."""
    if rule == "score":
        return point["guard"][name] < start["guard"][name] - tolerance
    return guard_change(start, point, name)[2] < -tolerance


def guard_limit(curve: Sequence[dict], tolerance: float = 0.0, rule: GuardRule = "score") -> float:
    """The largest weight up to which (every smaller weight included) no guard set falls (``guard_falls``) from
    its t = 0 score: how far from ``first`` the domains never trained on allow."""
    start = next(point for point in curve if point["t"] == 0.0)
    limit = 0.0
    for point in sorted(curve, key=lambda p: p["t"]):
        if any(guard_falls(start, point, name, tolerance, rule) for name in start["guard"]):
            break
        limit = point["t"]
    return limit
