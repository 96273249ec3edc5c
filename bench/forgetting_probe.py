"""Issue 13: does fine-tuning forget on text no row ever saw, measured with enough queries to see 0.002?

The quality table's never-trained sets are small (Cranfield 225 queries, CISI 76), so a change of 0.001-0.004
there lies inside query-sampling noise. This probe asks the same question of about 10,000 queries: neighbouring-span
retrieval (the first 32 words of a 128-word block -> the 96 words that follow, among every passage of the
collection; the pairing of ``embedlib.training.mixture.span_source``) on the NLTK collections that no row trains,
replays or guards on: ``abc`` (ABC science and rural news), ``state_union``, ``inaugural`` and ``webtext``.

    python bench/forgetting_probe.py                      # base vs the recommended row
    python bench/forgetting_probe.py --rows multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-merged-keep90-dev2000

Rows are the quality table's models under its ``--work`` (``bench/quality_table.py`` trains and merges them).
Each set's INT8 nDCG@10 (float and binary beside it, through the index's paths) and, per row, the INT8 change vs the
base with its paired-bootstrap 95% interval, per set and over all queries pooled. Writes
``bench/results/forgetting_probe.{json,png}``. It is a proxy: span continuation is not query-to-document search,
so it tells whether general text representations moved, not what Cranfield or CISI would score.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from eval_common import EVAL_CACHE  # noqa: E402
from quality_table import QUANTIZATIONS, RECOMMENDED, WORK, binary_code, evaluate_model  # noqa: E402
from result_file import Result  # noqa: E402

from embedlib.data import default_model_path  # noqa: E402
from embedlib.eval.beir import BeirDataset  # noqa: E402
from embedlib.eval.metrics import paired_bootstrap  # noqa: E402
from embedlib.eval.report import figure_png  # noqa: E402
from embedlib.training.config import SourceConfig  # noqa: E402
from embedlib.training.mixture import span_source  # noqa: E402

TEXT = ROOT.parent / "shared" / "data" / "text"
# collection -> members of its NLTK zip (READMEs left out); none of them is read by any training or guard source
COLLECTIONS = {"abc": ("science.txt", "rural.txt"), "state_union": None, "inaugural": None,
               "webtext": ("overheard", "pirates", "singles", "wine")}
METRIC = "ndcg@10"  # what quality_table.evaluate_model scores a query-to-document set by


def extract_collection(name: str, members: tuple[str, ...] | None, folder: Path) -> Path:
    """The collection's texts as ``folder/<name>/*.txt`` (span_source reads .txt files); all members if None."""
    target = folder / name
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(TEXT / f"{name}.zip") as archive:
        for member in archive.namelist():
            stem = Path(member).name
            if member.endswith("/") or stem == "README" or (members is not None and stem not in members):
                continue
            (target / f"{Path(stem).stem}.txt").write_bytes(archive.read(member))
    return target


def probe_sets(folder: Path) -> dict[str, BeirDataset]:
    """One span-retrieval set per collection: every span pair it holds, over all of its passages."""
    return {name: span_source(SourceConfig(name=name, kind="spans", url=str(extract_collection(name, members, folder)))).pool
            for name, members in COLLECTIONS.items()}


def pooled(scores: dict) -> dict[str, float]:
    """Every set's per-query INT8 scores in one dict (ids prefixed by set)."""
    return {f"{s}/{qid}": v for s, entry in scores.items() for qid, v in entry["int8_per_query"].items()}


def change_vs_base(base: dict, row: dict) -> dict:
    """INT8 change vs base and its paired-bootstrap 95% interval, per set and pooled over all queries."""
    pairs = {s: (base[s]["int8_per_query"], row[s]["int8_per_query"]) for s in base}
    pairs["all"] = (pooled(base), pooled(row))
    out = {}
    for name, (first, second) in pairs.items():
        change, low, high = paired_bootstrap(first, second)
        out[name] = {"change": round(change, 4), "ci95": [round(low, 4), round(high, 4)],
                     "significant": "below" if high < 0 else "above" if low > 0 else "no"}
    return out


def forest_png(changes: dict[str, dict]) -> bytes:
    """Each row's INT8 change vs base with its 95% interval, per set and pooled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(next(iter(changes.values())))
    prefix = os.path.commonprefix(list(changes)) if len(changes) > 1 else ""
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(sets) * len(changes)))
    labels, y = [], 0
    for s in sets:
        for row, change in changes.items():
            low, high = change[s]["ci95"]
            ax.errorbar(change[s]["change"], y, xerr=[[change[s]["change"] - low], [high - change[s]["change"]]],
                        fmt="o", capsize=3, color="black" if s == "all" else "tab:blue")
            labels.append(f"{s}: " + (f"…{row[len(prefix):]}" if row[len(prefix):] else row))
            y += 1
    ax.axvline(0, color="gray", linewidth=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"INT8 {METRIC} change vs base, 95% paired-bootstrap interval")
    if prefix:
        ax.set_title(f"…: {prefix}", fontsize=8)
    return figure_png(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=RECOMMENDED, help="comma-separated quality-table rows with a model under --work")
    parser.add_argument("--work", default=WORK, help="bench/quality_table.py's --work, where its models are")
    parser.add_argument("--eval-max-length", type=int, default=256)
    parser.add_argument("--cache", default=EVAL_CACHE)
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    paths = {"base": str(default_model_path())} | {r: str(Path(args.work) / r) for r in rows}
    missing = [r for r, p in paths.items() if not (Path(p) / "config.json").exists()]
    if missing:
        raise SystemExit(f"no model for {missing} under {args.work}: run bench/quality_table.py --rows {','.join(missing)}")
    result = Result("forgetting_probe")
    sets = probe_sets(Path(args.work) / "probe-text")
    print({name: f"{len(d.qrels)} queries, {len(d.corpus)} passages" for name, d in sets.items()}, flush=True)
    scores, wall = {}, {}
    for row, path in paths.items():
        started = time.time()
        scores[row] = evaluate_model(row, path, {name: (dataset, False) for name, dataset in sets.items()}, args)
        wall[row] = round(time.time() - started, 1)
    changes = {row: change_vs_base(scores["base"], scores[row]) for row in rows}
    for row, change in changes.items():
        print(f"{row}: " + ", ".join(f"{s} {c['change']:+.4f} [{c['ci95'][0]:+.4f}, {c['ci95'][1]:+.4f}]"
                                     for s, c in change.items()), flush=True)
    figures = {
        "metric": METRIC, "eval_max_length": args.eval_max_length,
        "sets": {name: {"queries": len(d.qrels), "passages": len(d.corpus)} for name, d in sets.items()},
        "rows": {row: {"model": paths[row], "binary_code": binary_code(paths[row]), "wall_s": wall[row],
                       "scores": {s: {q: round(v[q], 4) for q in QUANTIZATIONS} for s, v in scores[row].items()}}
                 for row in paths},
        "int8_change_vs_base": changes,
    }
    (result.write(figures).parent / "forgetting_probe.png").write_bytes(forest_png(changes))


if __name__ == "__main__":
    main()
