"""SciFact through the indexing pipeline vs a single-process ``Encoder.encode`` loop (same model, same machine).

    python bench/index_scifact.py                      # whole SciFact corpus (5,183 docs), MiniLM, int8
    python bench/index_scifact.py --docs 1000          # quicker (throughput only is meaningful then)
    python bench/index_scifact.py --actors 2           # two encoder actors, each with half the cores
    python bench/index_scifact.py --actors 2 --batch-rows 256   # smaller batches: a shorter tail on 2 actors

Prints and writes to ``bench/results/index_scifact.json``: (1) throughput: docs/s of the encode step (read ->
check -> encoder actor pool -> staging parts, actor start-up and model load included) and of the
single-process loop (run just before and just after the pipeline, its rate over both passes: the machine's
speed drifts by several percent between minutes), and their ratio; (2) quality: nDCG@10 of the published index
searched through ``ShardedIndex`` vs the in-memory exact result (int8 docs and queries, cosine, top-10 by numpy); (3) bytes
per document of the published shards against the vector width.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import Result

from embedlib.data import default_model_path
from embedlib.encoding.encoder import Encoder
from embedlib.encoding.formats import cosine_similarity
from embedlib.eval.beir import load_beir
from embedlib.eval.metrics import evaluate_run, run_from_hits
from embedlib.index import IndexJobConfig, ShardedIndex, build_index
from embedlib.local_ray import keep_idle_workers
from embedlib.search.multivector import top_k

SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact"


def write_corpus(dataset, ids: list[str], folder: Path) -> str:
    path = folder / "corpus.jsonl"
    with open(path, "w") as f:
        for doc_id in ids:
            f.write(json.dumps({"_id": doc_id, **dataset.corpus[doc_id]}) + "\n")
    return str(path)


def pipeline(corpus: str, output: str, model: str, args: argparse.Namespace) -> tuple[float, object]:
    summary = build_index(IndexJobConfig(input=corpus, output=output, model=model, shard_size=args.shard_size,
                                         actors=args.actors, batch_rows=args.batch_rows, show_progress=False))
    return summary.embedded / summary.encode_seconds, summary


def timed_loop(encoder: Encoder, texts: list[str]) -> tuple[np.ndarray, float]:
    """The single-process ``Encoder.encode`` loop over ``texts``: its int8 vectors and docs/s."""
    started = time.perf_counter()
    vectors = encoder.encode(texts, quantization="int8", show_progress=True)
    return vectors, len(texts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default=str(SCIFACT))
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--docs", type=int, help="only the first N documents")
    parser.add_argument("--shard-size", type=int, default=1000)
    parser.add_argument("--actors", type=int, default=1, help="encoder actors (each gets cores / actors threads)")
    parser.add_argument("--batch-rows", type=int, default=IndexJobConfig.batch_rows,
                        help="rows per encoder batch (one staging part each)")
    args = parser.parse_args()
    name = "index_scifact" + (f"_{args.docs}" if args.docs else "") + (f"_actors{args.actors}" if args.actors > 1 else "")
    name += f"_batch{args.batch_rows}" if args.batch_rows != IndexJobConfig.batch_rows else ""
    result = Result(name)

    dataset = load_beir(args.data)
    ids = dataset.doc_ids()[: args.docs]
    texts = dataset.doc_texts()[: len(ids)]
    keep_idle_workers()
    ray.init(ignore_reinit_error=True, log_to_driver=False, include_dashboard=False)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = write_corpus(dataset, ids, tmp)
        (tmp / "warm").mkdir()
        warm = write_corpus(dataset, ids[:50], tmp / "warm")
        pipeline(warm, str(tmp / "warm-index"), args.model, args)  # starts Ray's worker processes

        encoder = Encoder.from_pretrained(args.model)
        doc_vectors, loop_before = timed_loop(encoder, texts)
        pipeline_rate, summary = pipeline(corpus, str(tmp / "index"), args.model, args)
        _, loop_after = timed_loop(encoder, texts)
        single_rate = 2 / (1 / loop_before + 1 / loop_after)  # the loop's rate over both passes
        print(summary)
        print(
            f"throughput ({len(ids)} docs, {Path(args.model).name}, int8, {args.actors} encoder actor(s), this "
            f"machine): pipeline encode stage "
            f"{pipeline_rate:.1f} docs/s, single-process Encoder.encode {single_rate:.1f} docs/s (before "
            f"{loop_before:.1f}, after {loop_after:.1f}), "
            f"ratio {pipeline_rate / single_rate:.3f} (whole job incl. read/shards/manifest: "
            f"{summary.docs_per_second:.1f} docs/s)"
        )

        queries = dataset.judged_queries()
        query_vectors = encoder.encode(list(queries.values()), quantization="int8")
        exact = cosine_similarity(query_vectors, doc_vectors)
        exact_run = run_from_hits(list(queries), top_k(exact, 10).named(ids))
        exact_ndcg = evaluate_run(dataset.qrels, exact_run, (10,))[0]["ndcg@10"]

        index = ShardedIndex.open(tmp / "index", model=encoder)
        run = run_from_hits(list(queries), index.search(list(queries.values()), k=10))
        index_ndcg = evaluate_run(dataset.qrels, run, (10,))[0]["ndcg@10"]
        same = np.mean([set(run[q]) == set(exact_run[q]) for q in queries])
        print(
            f"quality ({len(queries)} judged queries, {len(ids)} docs, {len(index.manifest['shards'])} shards): "
            f"ShardedIndex nDCG@10 {index_ndcg:.4f}, in-memory exact nDCG@10 {exact_ndcg:.4f}, "
            f"difference {abs(index_ndcg - exact_ndcg):.4f}; identical top-10 sets for {same:.4f} of queries"
        )
        width = index.manifest["dim"]
        print(f"storage: {summary.bytes_per_doc:.1f} bytes/doc for int8 width {width} "
              f"(overhead {summary.bytes_per_doc - width:.1f} bytes/doc over the vector)")
        result.write({
            "docs": len(ids), "model": Path(args.model).name, "quantization": "int8", "actors": args.actors,
            "batch_rows": args.batch_rows,
            "pipeline_encode_docs_per_s": round(pipeline_rate, 2), "single_process_docs_per_s": round(single_rate, 2),
            "single_process_docs_per_s_before_after": [round(loop_before, 2), round(loop_after, 2)],
            "throughput_ratio": round(pipeline_rate / single_rate, 3),
            "whole_job_docs_per_s": round(summary.docs_per_second, 2), "job_seconds": round(summary.seconds, 1),
            "index_ndcg@10": round(index_ndcg, 4), "exact_ndcg@10": round(exact_ndcg, 4),
            "identical_top10_fraction": round(float(same), 4), "queries": len(queries),
            "shards": len(index.manifest["shards"]), "bytes_per_doc": round(summary.bytes_per_doc, 1),
            "width": width,
        })


if __name__ == "__main__":
    main()
