"""Acceptance: all-MiniLM-L6-v2 (float, int8, binary) and BM25 side by side on SciFact test.

Published MiniLM nDCG@10 (MTEB): 0.6451; accepted 0.645 ± 0.005. Usage: ``python bench/eval_scifact.py``.
"""

from eval_common import SHARED, minilm, print_metrics, run_job

PUBLISHED, TOLERANCE = 0.645, 0.005

if __name__ == "__main__":
    out = "outputs/eval/scifact"
    document = run_job(["--dataset", str(SHARED / "scifact"), "--model", minilm(), "--bm25"], out, "eval_scifact")
    print_metrics(document, ("ndcg@10", "mrr@10", "recall@10", "recall@100", "recall@1000"))
    ndcg = document["systems"]["all-MiniLM-L6-v2/float"]["metrics"]["ndcg@10"]
    verdict = "within" if abs(ndcg - PUBLISHED) <= TOLERANCE else "OUTSIDE"
    print(f"\nMiniLM float nDCG@10 = {ndcg:.4f} ({verdict} {PUBLISHED} ± {TOLERANCE}); "
          f"BM25 nDCG@10 = {document['systems']['bm25']['metrics']['ndcg@10']:.4f}; report in {out}")
