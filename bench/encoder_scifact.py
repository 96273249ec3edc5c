"""Issue 2 acceptance: all-MiniLM-L6-v2 through ``Encoder`` on SciFact (quality) and vs sentence-transformers (speed).

    python bench/encoder_scifact.py [--dataset ../shared/data/scifact] [--speed-docs 2000] [--repeats 3]

Prints nDCG@10 (pytrec_eval, BEIR/MTEB style: title + " " + text, exact search) for float, int8 and binary,
then the encode throughput of ``Encoder.encode`` and ``SentenceTransformer.encode`` on the same model and
texts, measured alternately in one run, and their ratio (medians).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from embedlib import Encoder
from embedlib.data import default_model_path
from embedlib.encoding.formats import similarity
from embedlib.encoding.quantize import quantize
from embedlib.eval.beir import load_beir
from embedlib.eval.metrics import evaluate_run, run_from_hits
from embedlib.search.results import SearchResult

ROOT = Path(__file__).resolve().parents[1]


def exact_topk(query_vectors: np.ndarray, doc_vectors: np.ndarray, quantization: str, k: int) -> SearchResult:
    scores = similarity(query_vectors, doc_vectors, quantization)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return SearchResult(positions=top, scores=np.take_along_axis(scores, top, axis=1))


def quality(encoder: Encoder, dataset_url: str) -> dict[str, float]:
    """nDCG@10 per quantization. Texts are encoded once in float; the int8/binary codes are derived with the
    same ``quantize`` the Encoder applies (tests assert ``encode(q)`` equals it), saving two corpus passes."""
    data = load_beir(dataset_url)
    queries = data.judged_queries()
    docs = torch.from_numpy(encoder.encode(data.doc_texts(), quantization="float", show_progress=True))
    query_vectors = torch.from_numpy(encoder.encode(list(queries.values()), quantization="float"))
    results = {}
    for quantization in ("float", "int8", "binary"):
        q, d = quantize(query_vectors, quantization), quantize(docs, quantization)
        found = exact_topk(q, d, quantization, 1000).named(data.doc_ids())
        metrics, _ = evaluate_run(data.qrels, run_from_hits(list(queries), found))
        results[quantization] = metrics["ndcg@10"]
    return results


def speed(encoder: Encoder, model_path: Path, texts: list[str], repeats: int) -> tuple[float, float]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_path), device="cpu")
    ours, theirs = [], []
    encoder.encode(texts[:64], quantization="float")  # warm-up both
    st.encode(texts[:64])
    for _ in range(repeats):
        start = time.perf_counter()
        encoder.encode(texts, quantization="float")
        ours.append(len(texts) / (time.perf_counter() - start))
        start = time.perf_counter()
        st.encode(texts)
        theirs.append(len(texts) / (time.perf_counter() - start))
    return statistics.median(ours), statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--speed-docs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-quality", action="store_true")
    args = parser.parse_args()

    model_path = default_model_path()
    encoder = Encoder.from_pretrained(model_path)
    print(f"model: {model_path}  torch threads: {torch.get_num_threads()}")
    if not args.skip_quality:
        scores = quality(encoder, args.dataset)
        print(f"SciFact test nDCG@10  float={scores['float']:.4f}  int8={scores['int8']:.4f}  "
              f"binary={scores['binary']:.4f}  (int8 loss {scores['float'] - scores['int8']:+.4f}; "
              f"published MTEB float 0.6451)")
    texts = load_beir(args.dataset).doc_texts()[: args.speed_docs]
    ours, theirs = speed(encoder, model_path, texts, args.repeats)
    print(f"encode speed on {len(texts)} SciFact docs (median of {args.repeats}): Encoder {ours:.1f} docs/s, "
          f"SentenceTransformer {theirs:.1f} docs/s, ratio {ours / theirs:.3f}")


if __name__ == "__main__":
    main()
