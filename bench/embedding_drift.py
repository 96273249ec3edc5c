"""Issue 13: how far fine-tuning moves the embeddings of each evaluation set's texts away from the base model's.

    python bench/embedding_drift.py                  # the shipped recipe's seeds 0 and 1, unmerged, and the recommended
    python bench/embedding_drift.py --rows R1,R2     # other quality-table rows (their models under --work)

For each row and each text set, the mean ``1 - cos`` between the base model's and the row's float embeddings of
the same texts, at the quality table's evaluation length: every document and judged query of the five evaluation
sets (from the quality table's embedding cache when it has them) and 400 spans of wikitext-2's test split. Beside
it, the row's INT8 change vs base on the set, read from the quality table's result file, so that one can see
whether the sets that lose are the ones that moved most. Writes ``bench/results/embedding_drift-len<L>.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from eval_common import EVAL_CACHE  # noqa: E402
from quality_table import DATA, QUORA_HELDOUT, RECOMMENDED, WORK, eval_sets, table_name  # noqa: E402
from result_file import RESULTS, Result  # noqa: E402

from embedlib.data import default_model_path  # noqa: E402
from embedlib.encoding.formats import normalized  # noqa: E402
from embedlib.eval.systems import ModelEmbeddings  # noqa: E402
from embedlib.training.mixture import heldout_dataset  # noqa: E402

SHIPPED = "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus"
DEFAULT_ROWS = f"{SHIPPED},{SHIPPED}-seed1,{RECOMMENDED}"
WIKITEXT_SPANS, SPAN_WORDS = 400, 96


def text_sets() -> dict[str, list[str]]:
    """Each evaluation set's documents and judged queries, and a seeded sample of wikitext-2 test spans."""
    texts = {}
    for name, (dataset, q2q) in eval_sets(heldout_dataset(QUORA_HELDOUT)).items():
        texts[f"{name}/docs"] = dataset.doc_texts()
        if not q2q:  # Quora's queries are its documents
            texts[f"{name}/queries"] = list(dataset.judged_queries().values())
    words = (DATA / "text" / "wikitext2.test.tokens").read_text().split()
    spans = [" ".join(words[i:i + SPAN_WORDS]) for i in range(0, len(words) - SPAN_WORDS, SPAN_WORDS)]
    texts["wikitext-test/spans"] = random.Random(0).sample(spans, WIKITEXT_SPANS)
    return texts


def mean_drift(base: np.ndarray, other: np.ndarray) -> float:
    """Mean ``1 - cos`` between matching rows."""
    return float((1.0 - (normalized(base) * normalized(other)).sum(axis=1)).mean())


def int8_changes(row: str, max_length: int) -> dict[str, float]:
    """The row's INT8 change vs base per set, from the quality table at ``max_length`` (empty: not measured)."""
    path = RESULTS / f"{table_name(max_length)}.json"
    sets = json.loads(path.read_text())["sets"] if path.exists() else {}
    return {name: round(cells[row]["int8"] - cells["base"]["int8"], 4) for name, cells in sets.items() if row in cells}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=DEFAULT_ROWS)
    parser.add_argument("--work", default=WORK, help="quality_table.py's --work")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--cache", default=EVAL_CACHE)
    args = parser.parse_args()
    result = Result(f"embedding_drift-len{args.max_length}")
    started = time.time()
    texts = text_sets()
    base = ModelEmbeddings.load("base", default_model_path(), cache=args.cache, max_length=args.max_length)
    base_vectors = {name: base.float_vectors(items, name) for name, items in texts.items()}
    figures: dict = {"max_length": args.max_length, "texts": {name: len(items) for name, items in texts.items()},
                     "rows": {}}
    for row in args.rows.split(","):
        model = ModelEmbeddings.load(row, str(Path(args.work) / row), cache=args.cache, max_length=args.max_length)
        drift = {name: round(mean_drift(base_vectors[name], model.float_vectors(items, name)), 4)
                 for name, items in texts.items()}
        figures["rows"][row] = {"drift": drift, "int8_change_vs_base": int8_changes(row, args.max_length)}
        print(f"{row}: " + ", ".join(f"{name} {value:.4f}" for name, value in drift.items()), flush=True)
    figures["wall_s"] = round(time.time() - started, 1)
    print(f"written {result.write(figures)}")


if __name__ == "__main__":
    main()
