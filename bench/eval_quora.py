"""Acceptance: query-to-query Recall@10/@100 on the Quora duplicate-question set (a query never retrieves
itself), all-MiniLM-L6-v2 float/int8/binary and BM25. Usage: ``python bench/eval_quora.py``."""

from eval_common import SHARED, minilm, print_metrics, run_job

if __name__ == "__main__":
    out = "outputs/eval/quora-q2q"
    document = run_job(["--dataset", str(SHARED / "quora-q2q"), "--q2q", "--model", minilm(), "--bm25"], out, "eval_quora")
    print_metrics(document, ("recall@10", "recall@100", "ndcg@10", "mrr@10"))
    print(f"\n{document['dataset']['queries']} queries over {document['dataset']['documents']} questions; "
          f"report in {out}")
