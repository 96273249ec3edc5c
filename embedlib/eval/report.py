"""The evaluation report at any URL: ``metrics.json`` (stable keys), ``per_query.json``, ``report.md``, PNG plots."""

from __future__ import annotations

import io
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from embedlib import storage  # noqa: E402
from embedlib.eval.run import CURVE_K, HEADLINE, SystemResult  # noqa: E402

FORMAT = "embedlib-eval/1"
RECALL_PLOT = "recall_at_k.png"
SCALE_PLOT = "recall_vs_corpus_size.png"
BYTES_PER_MB = 1_000_000


def storage_figures(bytes_per_doc: float) -> dict[str, float]:
    return {"bytes_per_doc": bytes_per_doc, "docs_per_mb": BYTES_PER_MB / bytes_per_doc if bytes_per_doc else 0.0}


def system_entry(result: SystemResult) -> dict:
    curve = {str(k): result.metrics[f"recall@{k}"] for k in CURVE_K if f"recall@{k}" in result.metrics}
    return {
        "description": result.description,
        "metrics": result.headline(),
        "recall_curve": curve,
        "storage": storage_figures(result.bytes_per_doc),
        "seconds": {"build": result.build_seconds, "search": result.search_seconds},
        "unknown_retrieved_ids": result.unknown_hits,
        "ann_recall_vs_exact": result.ann_recall or None,
    }


def metrics_document(dataset: dict, results: list[SystemResult], scale: dict | None = None,
                     bitext: dict | None = None) -> dict:
    """The machine-readable report; its keys are stable across runs."""
    return {
        "format": FORMAT,
        "dataset": dataset,
        "systems": {result.name: system_entry(result) for result in results},
        "scale": scale,
        "bitext": bitext,
    }


def _fmt(value) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4f}"
    return str(value)


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report_markdown(document: dict) -> str:
    dataset = document["dataset"]
    parts = [f"# Evaluation: {dataset.get('source', '')}", "",
             f"Mode **{dataset.get('mode')}**, split `{dataset.get('split')}`, "
             f"{dataset.get('queries')} judged queries, {dataset.get('documents')} documents.", ""]
    systems = document["systems"]
    if systems:
        parts += ["## Retrieval", "", markdown_table(
            ["system", *HEADLINE],
            [[name, *(entry["metrics"].get(key, float("nan")) for key in HEADLINE)]
             for name, entry in systems.items()]), ""]
        parts += ["## Storage", "", markdown_table(
            ["system", "bytes/doc", "docs/MB", "build s", "search s"],
            [[name, round(e["storage"]["bytes_per_doc"], 1), round(e["storage"]["docs_per_mb"], 1),
              round(e["seconds"]["build"], 1), round(e["seconds"]["search"], 1)] for name, e in systems.items()]),
            ""]
        ann = {name: e["ann_recall_vs_exact"] for name, e in systems.items() if e["ann_recall_vs_exact"]}
        if ann:
            parts += ["## ANN recall against exact search", "", markdown_table(
                ["system", "exact system", "top-10 overlap", "top-100 overlap"],
                [[name, a["exact_system"], a["@10"], a["@100"]] for name, a in ann.items()]), ""]
        parts += [f"![Recall@K per system]({RECALL_PLOT})", ""]
    if document.get("scale"):
        scale = document["scale"]
        keys = [key for key in next(iter(scale["points"].values()))[0] if key.startswith("recall@")]
        rows = [[name, f"{p['scale']:g}", p["documents"], *(p[key] for key in keys)]
                for name, points in scale["points"].items() for p in points]
        parts += ["## Recall as the corpus grows", "", f"Distractors from `{scale['distractors']}`.", "",
                  markdown_table(["system", "scale", "documents", *keys], rows), "",
                  f"![Recall vs corpus size]({SCALE_PLOT})", ""]
    if document.get("bitext"):
        rows = [[name, lang, *values.values()] for name, langs in document["bitext"].items()
                for lang, values in langs.items()]
        parts += ["## Bitext mining (accuracy@1)", "",
                  markdown_table(["system", "language", "xx→eng", "eng→xx"], rows), ""]
    return "\n".join(parts)


def recall_curve_png(document: dict) -> bytes:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, entry in document["systems"].items():
        ks = [int(k) for k in entry["recall_curve"]]
        axes.plot(ks, list(entry["recall_curve"].values()), marker="o", markersize=3, label=name)
    axes.set(xscale="log", xlabel="K", ylabel="Recall@K", ylim=(0, 1.02),
             title=f"Recall@K — {document['dataset'].get('source', '')}")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return figure_png(figure)


def scale_png(document: dict) -> bytes:
    """One panel per Recall@K, one line (colour) per system, corpus size on a log axis."""
    points = document["scale"]["points"]
    keys = [key for key in next(iter(points.values()))[0] if key.startswith("recall@")]
    figure, panels = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4.2), sharey=True, squeeze=False)
    for axes, key in zip(panels[0], keys, strict=True):
        for name, rows in points.items():
            axes.plot([r["documents"] for r in rows], [r[key] for r in rows], marker="o", markersize=3, label=name)
        axes.set(xscale="log", xlabel="documents in corpus", title=key.replace("recall@", "Recall@"), ylim=(0, 1.02))
        axes.grid(True, alpha=0.3)
    panels[0][0].set_ylabel("Recall")
    panels[0][-1].legend(fontsize=8, loc="lower left")
    figure.suptitle(f"Recall vs corpus size — {document['dataset'].get('source', '')}")
    return figure_png(figure)


def figure_png(figure) -> bytes:
    """A matplotlib figure as PNG bytes (tight layout, 120 dpi); the figure is closed."""
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    return buffer.getvalue()


def write_report(out: str, document: dict, per_query: dict[str, dict] | None = None) -> list[str]:
    """Write the report files under ``out`` (a path or any fsspec URL); returns their URLs."""
    files = {"metrics.json": json.dumps(document, indent=2, sort_keys=False).encode(),
             "report.md": report_markdown(document).encode()}
    if per_query is not None:
        files["per_query.json"] = json.dumps(per_query).encode()
    if document["systems"]:
        files[RECALL_PLOT] = recall_curve_png(document)
    if document.get("scale"):
        files[SCALE_PLOT] = scale_png(document)
    urls = []
    for name, data in files.items():
        url = storage.join(out, name)
        storage.write_bytes_atomic(url, data)
        urls.append(url)
    return urls
