"""DiffRetriever retrieval on a real BEIR set: K=1 vs K>1, dense vs sparse vs hybrid, adaptive K.

Zero-shot with the given diffusion checkpoint (Dream / LLaDA / embedlib format); without ``--model`` a tiny
randomly initialised embedlib diffusion Qwen3 is written and used, which is expected to score near zero:
the figures then check the pipeline, not the method.

    python bench/diffretriever_retrieval.py --dataset ../shared/data/scifact --out bench/results
    python bench/diffretriever_retrieval.py --model s3://bucket/models/pretrained-qwen3 --max-docs 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from embedlib.encoding.formats import embedded_text
from embedlib.encoding.representative_tokens import DiffRetrieverEncoder, RepresentativeTokens
from embedlib.eval.beir import BeirDataset, load_beir
from embedlib.eval.metrics import evaluate_run, run_from_hits
from embedlib.search.adaptive_k import KRouter, UnigramModel, budget_report
from embedlib.search.bm25 import BM25Index
from embedlib.search.hybrid import MODES, DiffRetrieverIndex, exhaustive_scores
from embedlib.search.multivector import top_k

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from result_file import Result, add_result_argument  # noqa: E402

METRIC = "ndcg@10"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--train-split", default="train", help="queries the adaptive-K router is fitted on")
    parser.add_argument("--model", default=None, help="diffusion checkpoint; default: a tiny random one")
    parser.add_argument("--max-docs", type=int, default=None, help="keep judged docs + the first N others")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    add_result_argument(parser, "diffretriever_retrieval")
    return parser.parse_args()


def subset(dataset: BeirDataset, extra: BeirDataset | None, max_docs: int | None) -> list[str]:
    """Doc ids: every judged doc of both splits, then others in file order up to ``max_docs`` in all."""
    ids = dataset.doc_ids()
    if max_docs is None or max_docs >= len(ids):
        return ids
    judged = {
        d for qrels in (dataset.qrels, extra.qrels if extra else {}) for docs in qrels.values() for d in docs
    }
    others = [d for d in ids if d not in judged]
    keep = judged | set(others[: max(0, max_docs - len(judged))])
    return [d for d in ids if d in keep]


def evaluate(qrels, query_ids, doc_ids, scores: np.ndarray) -> tuple[dict, dict]:
    return evaluate_run(qrels, run_from_hits(query_ids, top_k(scores, 100).named(doc_ids)), k_values=(10, 100))


def per_query(per: dict, query_ids: list[str]) -> np.ndarray:
    return np.array([per[q][METRIC] for q in query_ids])


def main() -> None:
    args = parse_args()
    result = Result(args.result)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    test = load_beir(args.dataset, "test")
    train = load_beir(args.dataset, args.train_split) if args.train_split else None
    doc_ids = subset(test, train, args.max_docs)
    texts = [embedded_text(test.corpus[d]["title"], test.corpus[d]["text"]) for d in doc_ids]
    queries = test.judged_queries()
    query_ids, query_texts = list(queries), list(queries.values())
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from embedlib.models.tiny_diffusion import make_tiny_diffusion_qwen3_checkpoint

            model = str(make_tiny_diffusion_qwen3_checkpoint(Path(tmp) / "tiny-diffusion-qwen3"))
        encoder = DiffRetrieverEncoder.from_pretrained(model, device="cpu", max_length=args.max_length)
    print(
        f"{args.dataset}: {len(doc_ids)} docs, {len(query_ids)} test queries; model {args.model or 'tiny random'}"
        f" ({sum(p.numel() for p in encoder.model.parameters()) / 1e6:.2f}M params, format {encoder.lm.format})"
    )

    docs: dict[int, RepresentativeTokens] = {}
    encode_seconds = {}
    for kp in (1, 16):
        start = time.perf_counter()
        docs[kp] = encoder.encode(texts, k=kp, kind="passage", batch_size=args.batch_size, show_progress=True)
        encode_seconds[kp] = time.perf_counter() - start
    query_tokens = {kq: encoder.encode(query_texts, k=kq, kind="query") for kq in (1, 4, 16)}

    results: dict[str, dict] = {}
    bm25 = BM25Index(doc_ids, texts)
    results["BM25 (reference)"] = evaluate_run(
        test.qrels, run_from_hits(query_ids, bm25.search(query_texts, 100)), k_values=(10, 100)
    )[0]
    per_query_dense: dict[int, np.ndarray] = {}
    for kq, kp in ((1, 1), (4, 16), (1, 16), (16, 16)):
        for mode in MODES:
            means, per = evaluate(
                test.qrels, query_ids, doc_ids, exhaustive_scores(query_tokens[kq], docs[kp], mode)
            )
            results[f"K_q={kq} K_p={kp} {mode}"] = means
            if kp == 16 and mode == "hybrid":
                per_query_dense[kq] = per_query(per, query_ids)

    print(f"\n{'configuration':<28} {'nDCG@10':>8} {'R@100':>7}")
    for name, means in results.items():
        print(f"{name:<28} {means['ndcg@10']:>8.4f} {means['recall@100']:>7.4f}")

    # Index path (FAISS multi-vector + integer inverted index) for the published setting K_q=4, K_p=16.
    index = DiffRetrieverIndex.build(docs[16])
    found = index.search(query_tokens[4], 100, mode="hybrid", candidates=200).named(doc_ids)
    index_means = evaluate_run(test.qrels, run_from_hits(query_ids, found), k_values=(10, 100))[0]
    storage = index.bytes_per_doc()
    print(
        f"\nindexed hybrid K_q=4 K_p=16 (candidates 200 per side): nDCG@10 {index_means['ndcg@10']:.4f}; "
        f"storage per doc: dense {storage['dense']:.0f} B, sparse {storage['sparse']:.0f} B"
    )
    print(
        f"passage encoding: K_p=1 {len(texts) / encode_seconds[1]:.1f} docs/s, "
        f"K_p=16 {len(texts) / encode_seconds[16]:.1f} docs/s (one forward pass per batch either way)"
    )

    # Adaptive K (hybrid scores, K_p=16): quantile rule on the test queries, thresholds fitted on train queries.
    unigram = UnigramModel(encoder.tokenizer, texts)
    routed = {
        "adaptive (quantile rule)": KRouter.from_quantiles((1, 4, 16), unigram.features(query_texts)).route(
            unigram.features(query_texts)
        )
    }
    if train is not None:
        train_queries = train.judged_queries()
        train_ids, train_texts = list(train_queries), list(train_queries.values())
        train_metric = {}
        for kq in (1, 4, 16):
            tokens = encoder.encode(train_texts, k=kq, kind="query")
            _, per = evaluate(train.qrels, train_ids, doc_ids, exhaustive_scores(tokens, docs[16], "hybrid"))
            train_metric[kq] = per_query(per, train_ids)
        fitted = KRouter.fit((1, 4, 16), unigram.features(train_texts), train_metric)
        routed[
            f"adaptive (fitted on {args.train_split}, thresholds {[round(t, 1) for t in fitted.thresholds]})"
        ] = fitted.route(unigram.features(query_texts))
    budget = budget_report(per_query_dense, routed)
    print(f"\nadaptive budget, hybrid, K_p=16, {METRIC}:")
    for name, row in budget.items():
        print(f"  {name:<60} {row['metric']:.4f}  (mean K_q {row['mean_k']:.2f})")

    report = {
        "args": vars(args),
        "docs": len(doc_ids),
        "queries": len(query_ids),
        "results": results,
        "indexed_hybrid": index_means,
        "bytes_per_doc": storage,
        "adaptive": budget,
        "docs_per_second": {str(k): len(texts) / s for k, s in encode_seconds.items()},
    }
    result.write(report, folder=out)
    plot(results, out / f"{args.result}.png")
    print(f"wrote {out / args.result}.png")


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    figure, axes = plt.subplots(figsize=(8, 0.35 * len(names) + 1))
    axes.barh(names, [results[n]["ndcg@10"] for n in names])
    axes.invert_yaxis()
    axes.set_xlabel("nDCG@10")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
