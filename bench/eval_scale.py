"""Acceptance: SciFact test queries against SciFact + distractor paragraphs from ../shared/data/text, Recall@10/
@100/@1000 per corpus size for all-MiniLM-L6-v2 float/int8/binary and BM25, and the recall-vs-size plot.

Scale s means s × 5,183 documents; 21 adds 103,660 distractors (32-word paragraphs; the text corpora hold
138k). Distractors are encoded in-process (FAISS flat) and cached; with ``--scale-index URL`` each scale is
instead a published incremental index version built by the Ray Data pipeline and searched in place. Usage:
``python bench/eval_scale.py [--scale 1,2,5,10,21] [--scale-index /tmp/scale-index --quantization int8]``.
"""

import argparse

from eval_common import SHARED, minilm, run_job

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", default="1,2,5,10,21")
    parser.add_argument("--bm25-only", action="store_true", help="no model: the lexical baseline alone")
    parser.add_argument("--scale-index", help="grow the corpus through the indexing pipeline under this URL")
    parser.add_argument("--quantization", default="float,int8,binary")
    args = parser.parse_args()
    out = "outputs/eval/scifact-scale" + ("-bm25" if args.bm25_only else "") + ("-index" if args.scale_index else "")
    name = "eval_scale" + ("_bm25" if args.bm25_only else "") + ("_through_index" if args.scale_index else "")
    model = [] if args.bm25_only else ["--model", minilm(), "--quantization", args.quantization]
    through_index = ["--scale-index", args.scale_index] if args.scale_index else []
    document = run_job(["--dataset", str(SHARED / "scifact"), *model, "--bm25", *through_index,
                        "--distractors", str(SHARED / "text"), "--distractor-max-words", "32",
                        "--scale", args.scale], out, name)
    print(f"\n{'system':28s}{'scale':>6s}{'documents':>11s}{'R@10':>8s}{'R@100':>8s}{'R@1000':>8s}")
    for name, points in document["scale"]["points"].items():
        for p in points:
            print(f"{name:28s}{p['scale']:6g}{p['documents']:11d}{p['recall@10']:8.4f}{p['recall@100']:8.4f}"
                  f"{p['recall@1000']:8.4f}")
    print(f"\nplot: {out}/recall_vs_corpus_size.png")
