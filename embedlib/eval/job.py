"""One evaluation run from a validated ``EvalConfig``: datasets and systems in, report files out."""

from __future__ import annotations

import logging
from typing import Any

from embedlib.encoding.representative_tokens import DiffRetrieverEncoder
from embedlib.eval.beir import load_beir
from embedlib.eval.bitext import load_tatoeba, tatoeba_languages
from embedlib.eval.config import EvalConfig, model_name
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
)

log = logging.getLogger(__name__)


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
