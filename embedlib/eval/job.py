"""One evaluation run from a validated ``EvalConfig``: datasets and systems in, report files out."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from embedlib.config import ConfigError, from_dict
from embedlib.encoding.formats import QUANTIZATIONS
from embedlib.encoding.representative_tokens import DEFAULT_K_PASSAGE, DEFAULT_K_QUERY, DiffRetrieverEncoder
from embedlib.eval.beir import load_beir
from embedlib.eval.bitext import load_tatoeba, tatoeba_languages
from embedlib.eval.diffretriever import DiffRetrieverSettings, DiffRetrieverSystem, PassageEncodings
from embedlib.eval.distractors import load_distractors
from embedlib.eval.report import metrics_document, write_report
from embedlib.eval.run import K_VALUES, evaluate_bitext, evaluate_scale, evaluate_systems, scale_sizes
from embedlib.eval.scale_index import evaluate_scale_through_index
from embedlib.eval.systems import (
    BM25System,
    DenseSystem,
    ModelEmbeddings,
    ShardedIndexSystem,
    System,
    model_name,
)
from embedlib.search.hybrid import DEFAULT_DENSE_WEIGHT, MODES

log = logging.getLogger(__name__)


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


def diffretriever_systems(config: EvalConfig) -> list[System]:
    """One system per model, K_q and mode; a model's corpus is encoded once and shared by its systems."""
    systems: list[System] = []
    for name, path in map(model_name, config.models):
        encoder = DiffRetrieverEncoder.from_pretrained(path, max_length=config.max_length)
        corpus = PassageEncodings(encoder, config.k_passage, show_progress=config.show_progress)
        for k_query in config.k_query:
            for mode in config.modes:
                settings = DiffRetrieverSettings(k_query=k_query, k_passage=config.k_passage, mode=mode,
                                                 dense_weight=config.dense_weight)
                systems.append(DiffRetrieverSystem(f"{name}/Kq={k_query}/{mode}", encoder, settings,
                                                   show_progress=config.show_progress, corpus=corpus))
    return systems


def make_systems(config: EvalConfig, models: list[ModelEmbeddings]) -> list[System]:
    systems: list[System] = diffretriever_systems(config) if config.method == "diffretriever" else []
    for model in models:
        for quantization in config.quantizations:
            systems.append(DenseSystem(model, quantization, config.dim))
            if config.ann:
                systems.append(DenseSystem(model, quantization, config.dim, ann="hnsw"))
    if config.bm25:
        systems.append(BM25System(show_progress=config.show_progress))
    return systems


def index_systems(config: EvalConfig, encoders: list) -> list[System]:
    """Published indexes; a loaded encoder with the index's weights serves as its query encoder."""
    from embedlib.index.manifest import read_manifest

    systems: list[System] = []
    for url in config.indexes:
        weights = read_manifest(url)["model"]["weights_hash"]
        encoder = next((e for e in encoders if e.weights_hash == weights), None)
        systems.append(ShardedIndexSystem(url, model=encoder))
    return systems


def run_evaluation(config: EvalConfig) -> dict:
    """Run every mode the config asks for, write the report under ``config.out``; returns ``metrics.json``."""
    config.validate()
    dense_models = config.models if config.method == "dense" else []
    models = [ModelEmbeddings.load(name, path, config.cache, config.max_length, config.show_progress)
              for name, path in map(model_name, dense_models)]
    systems = make_systems(config, models)
    encoders = [m.encoder for m in models] + [s.encoder for s in systems if isinstance(s, DiffRetrieverSystem)]
    dataset_info: dict[str, Any] = {"source": config.dataset, "split": config.split,
                                    "mode": "q2q" if config.q2q else "q2d"}
    results, scale, bitext = [], None, None
    if config.dataset:
        dataset = load_beir(config.dataset, config.split)
        dataset_info.update(queries=len(dataset.judged_queries()), documents=len(dataset.corpus))
        results = evaluate_systems(dataset, systems + index_systems(config, encoders), q2q=config.q2q)
        if config.distractors and systems:
            needed = max(n for _, n in scale_sizes(len(dataset.corpus), config.scales))
            texts = load_distractors(config.distractors, needed, config.distractor_max_words)
            exact = [s for s in systems if not (isinstance(s, DenseSystem) and s.ann != "exact")]
            if config.scale_index:  # models through the pipeline; other systems (BM25) in-process
                exact = [s for s in exact if not isinstance(s, DenseSystem)]
            points = evaluate_scale(dataset, exact, texts, config.scales, q2q=config.q2q, k_values=K_VALUES)
            if config.scale_index:
                points |= evaluate_scale_through_index(
                    dataset, config.models, config.quantizations, texts, config.scales, config.scale_index,
                    q2q=config.q2q, show_progress=config.show_progress)
            scale = {"distractors": config.distractors, "corpus_documents": len(dataset.corpus),
                     "max_words": config.distractor_max_words, "through_index": config.scale_index,
                     "points": points}
    else:
        dataset_info.update(source=config.bitext, mode="bitext", queries=None, documents=None)
    if config.bitext:
        langs = config.langs or tatoeba_languages(config.bitext)
        pairs = {lang: load_tatoeba(config.bitext, lang) for lang in langs}
        exact = [s for s in systems if not (isinstance(s, DenseSystem) and s.ann != "exact")]
        bitext = evaluate_bitext(exact, pairs)
    document = metrics_document(dataset_info, results, scale, bitext)
    write_report(config.out, document, {r.name: r.per_query for r in results})
    return document
