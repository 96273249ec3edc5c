"""Corpus growth through the indexing pipeline: each scale is built and published by ``build_index`` and
searched in place, as a nightly index would be.

The corpus and the distractors are written as jsonl parts under ``<root>/input``; scale after scale a new part
adds the next distractors and ``build_index`` runs again on the folder. Its incremental mode embeds only the
documents a scale adds (the rest are carried over by content hash), so growing to millions costs one pass over
the distractors per model and quantization.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from embedlib import storage
from embedlib.eval.beir import BeirDataset
from embedlib.eval.config import model_name
from embedlib.eval.distractors import distractor_ids
from embedlib.eval.metrics import evaluate_run
from embedlib.eval.run import K_VALUES, judged_queries, retrieve, scale_sizes
from embedlib.eval.systems import ShardedIndexSystem

log = logging.getLogger(__name__)


def write_part(url: str, ids: Sequence[str], titles: Sequence[str], texts: Sequence[str]) -> None:
    lines = (json.dumps({"_id": i, "title": ti, "text": te}) for i, ti, te in zip(ids, titles, texts, strict=True))
    storage.write_bytes_atomic(url, ("\n".join(lines) + "\n").encode())


def evaluate_scale_through_index(
    dataset: BeirDataset,
    models: Sequence[str],
    quantizations: Sequence[str],
    distractors: Sequence[str],
    scales: Sequence[float],
    root: str,
    q2q: bool = False,
    k_values: Sequence[int] = K_VALUES,
    show_progress: bool = True,
) -> dict[str, list[dict]]:
    """Recall@k per ``NAME/quantization`` as the corpus grows, each scale a published index version."""
    from embedlib.index import IndexJobConfig, build_index

    queries = judged_queries(dataset)
    sizes = scale_sizes(len(dataset.corpus), scales)
    ids = distractor_ids(max(n for _, n in sizes))
    inputs = storage.join(root, "input")
    corpus_ids = dataset.doc_ids()
    write_part(storage.join(inputs, "part-00000.jsonl"), corpus_ids,
               [dataset.corpus[d]["title"] for d in corpus_ids], [dataset.corpus[d]["text"] for d in corpus_ids])
    points: dict[str, list[dict]] = {}
    written = 0
    for number, (scale, count) in enumerate(sizes, start=1):
        if count > written:
            write_part(storage.join(inputs, f"part-{number:05d}.jsonl"), ids[written:count],
                       [""] * (count - written), distractors[written:count])
            written = count
        for spec in models:
            name, path = model_name(spec)
            for quantization in quantizations:
                system_name = f"{name}/{quantization}"
                output = storage.join(root, "indexes", f"{name}-{quantization}")
                summary = build_index(IndexJobConfig(input=inputs, output=output, model=path,
                                                     quantization=quantization, show_progress=show_progress))
                run = retrieve(ShardedIndexSystem(output, name=system_name), queries, max(k_values), q2q)
                means, _ = evaluate_run(dataset.qrels, run, k_values)
                row = {"scale": scale, "documents": len(dataset.corpus) + count, "distractors": count,
                       "embedded": summary.embedded, "index_version": summary.version}
                row.update({f"recall@{k}": means[f"recall@{k}"] for k in k_values})
                row["ndcg@10"] = means.get("ndcg@10", float("nan"))
                points.setdefault(system_name, []).append(row)
                log.info("scale %s (%d docs) %s through the pipeline: %s", scale, row["documents"], system_name, row)
    return points
