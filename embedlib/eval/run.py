"""Evaluation runs: Q2D / Q2Q retrieval, corpus growth with distractors, and bitext mining, over any systems."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from embedlib.eval.beir import BeirDataset, DatasetError
from embedlib.eval.distractors import distractor_ids
from embedlib.eval.metrics import Run, evaluate_run, run_from_hits, top_k_overlap
from embedlib.eval.systems import DenseSystem, Part, System

log = logging.getLogger(__name__)

K_VALUES = (10, 100, 1000)
CURVE_K = (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)
HEADLINE = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "recall@1000")


@dataclass
class SystemResult:
    """One system's scores on one dataset."""

    name: str
    description: dict
    metrics: dict[str, float]  # mean over judged queries, every cutoff of CURVE_K
    per_query: dict[str, dict[str, float]]
    bytes_per_doc: float
    build_seconds: float
    search_seconds: float
    unknown_hits: int = 0  # retrieved ids that are not in the dataset's corpus (a published index's extras)
    ann_recall: dict[str, float] = field(default_factory=dict)  # top-k overlap with the exact system

    def headline(self) -> dict[str, float]:
        return {key: self.metrics[key] for key in HEADLINE if key in self.metrics}


def corpus_part(dataset: BeirDataset) -> Part:
    return dataset.doc_ids(), dataset.doc_texts()


def retrieve(system: System, queries: dict[str, str], k: int, ignore_identical_ids: bool) -> Run:
    """The system's top-``k`` run for ``queries``; for Q2Q one extra hit is fetched to replace the self-hit."""
    depth = k + 1 if ignore_identical_ids else k
    return run_from_hits(list(queries), system.search(list(queries.values()), depth), k, ignore_identical_ids)


def judged_queries(dataset: BeirDataset) -> dict[str, str]:
    queries = dataset.judged_queries()
    if not queries:
        raise DatasetError(f"{dataset.source}: no judged queries to evaluate")
    return queries


def evaluate_systems(
    dataset: BeirDataset, systems: Sequence[System], q2q: bool = False, max_k: int = max(K_VALUES),
) -> list[SystemResult]:
    """Build every system over the dataset's corpus and score its run; ANN systems also get their top-k
    overlap with the exact system of the same model and quantization."""
    queries = judged_queries(dataset)
    corpus_ids = set(dataset.corpus)
    cutoffs = sorted({k for k in CURVE_K if k <= max_k} | {max_k})
    results, runs = [], {}
    for system in systems:
        start = time.perf_counter()
        system.build([corpus_part(dataset)])
        built = time.perf_counter()
        run = retrieve(system, queries, max_k, q2q)
        searched = time.perf_counter()
        unknown = sum(1 for hits in run.values() for did in hits if did not in corpus_ids)
        if unknown:
            log.warning("%s: %d retrieved ids are not in %s's corpus", system.name, unknown, dataset.source)
        means, per_query = evaluate_run(dataset.qrels, run, cutoffs)
        runs[system.name] = run
        results.append(SystemResult(system.name, system.describe(), means, per_query, system.bytes_per_doc(),
                                    built - start, searched - built, unknown))
    add_ann_recall(systems, results, runs)
    return results


def add_ann_recall(systems: Sequence[System], results: list[SystemResult], runs: dict[str, Run]) -> None:
    """For each in-process ANN system, the overlap of its top-10/100 with its exact twin's."""
    exact = {(s.model.name, s.quantization, s.dim): s.name for s in systems
             if isinstance(s, DenseSystem) and s.ann == "exact"}
    by_name = {s.name: s for s in systems}
    for result in results:
        system = by_name[result.name]
        if not isinstance(system, DenseSystem) or system.ann == "exact":
            continue
        twin = exact.get((system.model.name, system.quantization, system.dim))
        if twin:
            result.ann_recall = {f"@{k}": top_k_overlap(runs[result.name], runs[twin], k) for k in (10, 100)}
            result.ann_recall["exact_system"] = twin


def scale_sizes(corpus_size: int, scales: Sequence[float]) -> list[tuple[float, int]]:
    """``(scale, distractors)``: at scale ``s`` the corpus holds ``s × corpus_size`` documents."""
    if any(s < 1 for s in scales):
        raise ValueError(f"scale: every factor must be >= 1, got {list(scales)}")
    return [(s, round((s - 1) * corpus_size)) for s in sorted(set(scales))]


def evaluate_scale(
    dataset: BeirDataset, systems: Sequence[System], distractors: Sequence[str], scales: Sequence[float],
    q2q: bool = False, k_values: Sequence[int] = K_VALUES,
) -> dict[str, list[dict]]:
    """Recall@k of each system as the corpus grows with distractors; one row per scale, smallest first.

    Scales are run largest first so a model encodes the distractors once and smaller scales reuse the prefix.
    """
    queries = judged_queries(dataset)
    sizes = scale_sizes(len(dataset.corpus), scales)
    needed = max(n for _, n in sizes)
    if needed > len(distractors):
        raise ValueError(f"scale {max(scales)} needs {needed} distractors, the source gave {len(distractors)}")
    ids = distractor_ids(needed)
    clashes = set(ids) & set(dataset.corpus)
    if clashes:
        raise DatasetError(f"{dataset.source}: corpus ids clash with distractor ids: {sorted(clashes)[:10]}")
    points: dict[str, list[dict]] = {system.name: [] for system in systems}
    for scale, count in reversed(sizes):
        for system in systems:
            system.build([corpus_part(dataset), (ids[:count], distractors[:count])])
            run = retrieve(system, queries, max(k_values), q2q)
            means, _ = evaluate_run(dataset.qrels, run, k_values)
            row = {"scale": scale, "documents": len(dataset.corpus) + count, "distractors": count}
            row.update({f"recall@{k}": means[f"recall@{k}"] for k in k_values})
            row["ndcg@10"] = means.get("ndcg@10", float("nan"))
            points[system.name].insert(0, row)
            log.info("scale %s (%d docs) %s: %s", scale, row["documents"], system.name, row)
    return points


def bitext_accuracy(system: System, source: Sequence[str], target: Sequence[str]) -> float:
    """Fraction of ``source`` sentences whose nearest ``target`` sentence is their own translation."""
    ids = [str(i) for i in range(len(target))]
    system.build([(ids, target)])
    hits = system.search(list(source), 1).hits()
    return sum(1 for i, row in enumerate(hits) if row and row[0] == str(i)) / len(source)


def evaluate_bitext(
    systems: Sequence[System], pairs: dict[str, tuple[list[str], list[str]]],
) -> dict[str, dict[str, dict[str, float]]]:
    """Accuracy@1 of bitext mining in both directions: ``{system: {lang: {xx_to_eng, eng_to_xx}}}``."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    for system in systems:
        for lang, (source, english) in pairs.items():
            results.setdefault(system.name, {})[lang] = {
                f"{lang}_to_eng": bitext_accuracy(system, source, english),
                f"eng_to_{lang}": bitext_accuracy(system, english, source),
            }
    return results
