"""``EvalConfig``: an evaluation run's settings, validated at the edge (errors name the field).

Torch-free, so that ``jobs/evaluate.py`` checks flags and configs in well under a second, before the models load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from embedlib.config import ConfigError, from_dict
from embedlib.encoding.formats import QUANTIZATIONS
from embedlib.encoding.representative_defaults import DEFAULT_K_PASSAGE, DEFAULT_K_QUERY
from embedlib.search.hybrid import DEFAULT_DENSE_WEIGHT, MODES

METHODS = ("dense", "diffretriever")


@dataclass
class EvalConfig:
    """Everything one evaluation run needs; ``validate()`` names the first bad field."""

    out: str
    dataset: str | None = None  # BEIR layout (jsonl or parquet) at any URL
    split: str = "test"
    q2q: bool = False  # the corpus is a pool of queries; a query never retrieves itself
    models: list[str] = field(default_factory=list)  # PATH_OR_URL or NAME=PATH_OR_URL
    # "dense": pooled single vectors per quantization; "diffretriever": a diffusion LM's K mask-token
    # vectors (MaxSim) and sparse vectors, per K_q and scoring mode (models must be diffusion checkpoints).
    method: str = "dense"
    k_query: list[int] = field(default_factory=lambda: [DEFAULT_K_QUERY])  # diffretriever: K_q values
    k_passage: int = DEFAULT_K_PASSAGE  # diffretriever
    modes: list[str] = field(default_factory=lambda: list(MODES))  # diffretriever: dense, sparse, hybrid
    dense_weight: float = DEFAULT_DENSE_WEIGHT  # diffretriever hybrid
    quantizations: list[str] = field(default_factory=lambda: list(QUANTIZATIONS))
    dim: int | None = None  # Matryoshka truncation
    bm25: bool = False
    ann: bool = False  # also search each model/quantization with an in-process HNSW, scored against exact
    indexes: list[str] = field(default_factory=list)  # published ShardedIndex URLs, evaluated in place
    distractors: str | None = None  # text folder or parquet corpus
    scales: list[float] = field(default_factory=lambda: [1.0])
    distractor_max_words: int = 48
    # Grow the corpus through the indexing pipeline instead of in-process FAISS: each scale is a published
    # index version under this URL (incremental: a scale embeds only the distractors it adds).
    scale_index: str | None = None
    bitext: str | None = None  # Tatoeba folder
    langs: list[str] = field(default_factory=list)  # bitext languages; empty: all
    cache: str | None = None  # embedding cache URL (reused across runs of the same weights and texts)
    max_length: int | None = None
    show_progress: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EvalConfig:
        """Build from plain data (parsed YAML, CLI flags): unknown, missing or mistyped fields are ``ConfigError``s."""
        return from_dict(cls, values).validate()

    def validate(self) -> EvalConfig:
        if not self.out:
            raise ConfigError("out: an output path or URL is required")
        if not self.dataset and not self.bitext:
            raise ConfigError("dataset: a dataset URL is required (or bitext for bitext mining)")
        if not (self.models or self.bm25 or self.indexes):
            raise ConfigError("models: name at least one model, bm25 or an index")
        if self.method not in METHODS:
            raise ConfigError(f"method: must be one of {METHODS}, got {self.method!r}")
        if self.method == "diffretriever":
            self.validate_diffretriever()
        bad = [q for q in self.quantizations if q not in QUANTIZATIONS]
        if bad or not self.quantizations:
            raise ConfigError(f"quantizations: each must be one of {QUANTIZATIONS}, got {self.quantizations}")
        if self.dim is not None and self.dim < 1:
            raise ConfigError(f"dim: must be a positive integer, got {self.dim}")
        if self.dim is not None and "binary" in self.quantizations and self.dim % 8:
            raise ConfigError(f"dim: binary codes need a multiple of 8, got {self.dim}")
        if any(s < 1 for s in self.scales) or not self.scales:
            raise ConfigError(f"scales: factors must be >= 1, got {self.scales}")
        if max(self.scales) > 1 and not self.distractors:
            raise ConfigError("distractors: scales above 1 need a distractor source")
        if self.distractors and not self.dataset:
            raise ConfigError("dataset: the distractor mode grows a dataset's corpus; name the dataset")
        if self.scale_index and not (self.distractors and self.models and self.method == "dense"):
            raise ConfigError("scale_index: needs distractors and at least one dense-method model")
        if self.scale_index and self.max_length is not None:
            raise ConfigError("max_length: the indexing pipeline encodes at the model's own max length; "
                                  "leave max_length unset with scale_index")
        if self.distractor_max_words < 1:
            raise ConfigError(f"distractor_max_words: must be >= 1, got {self.distractor_max_words}")
        return self

    def validate_diffretriever(self) -> None:
        if not self.k_query or any(not isinstance(k, int) or k < 1 for k in self.k_query):
            raise ConfigError(f"k_query: integers >= 1, got {self.k_query}")
        if not isinstance(self.k_passage, int) or self.k_passage < 1:
            raise ConfigError(f"k_passage: an integer >= 1, got {self.k_passage!r}")
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ConfigError(f"modes: each must be one of {MODES}, got {self.modes}")
        if not 0 <= self.dense_weight <= 1:
            raise ConfigError(f"dense_weight: must be in [0, 1], got {self.dense_weight}")
        if self.ann or self.bitext:
            raise ConfigError("ann/bitext: not available with method diffretriever")


def model_name(spec: str) -> tuple[str, str]:
    """``NAME=PATH`` or ``PATH`` -> (name, path); a bare path is named after its folder."""
    head, sep, tail = spec.partition("=")
    if sep and "/" not in head and ":" not in head:
        return head, tail
    parts = [p for p in spec.rstrip("/").split("/") if p]
    name = parts[-1] if parts else spec
    if name == "model" and len(parts) > 1:
        name = parts[-2]
    return name, spec
