"""Served search under node loss, on a real 3-node local cluster: how long a query waits while shards move.

    python bench/search_node_loss.py                      # writes bench/results/search_node_loss.json

An index of ``--docs`` Cranfield documents (tiny real-format model) in ``--shards`` shards is served by
``ServedIndex`` (one actor per shard, spread over the nodes). Each trial removes the worker node serving the
most shards, sends a query batch at once and times how long it waits for the re-placed shards (they reload
from storage), checks the answers equal those before the loss, then adds the node back.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_cluster import add_worker_node, local_cluster, node_named  # noqa: E402
from result_file import Result  # noqa: E402

from embedlib.search.results import SearchResult  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=600)
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--name", default="search_node_loss")
    return parser.parse_args(argv)


def build(folder: Path, docs: int, shards: int) -> str:
    from embedlib.data import sample_corpus_rows
    from embedlib.index import IndexJobConfig, build_index
    from embedlib.models.tiny import make_tiny_checkpoint

    model = make_tiny_checkpoint(folder / "tiny", "pplx-embed")
    rows = sample_corpus_rows(docs)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    output = str(folder / "index")
    build_index(IndexJobConfig(input=str(folder / "corpus.jsonl"), output=output, model=str(model),
                               shard_size=-(-len(rows) // shards), show_progress=False))
    return output


def trial(cluster, index, queries: np.ndarray, expected: SearchResult) -> dict:
    placement = index.placement()
    counts = Counter(placement)
    name = max(("node-0", "node-1"), key=lambda n: counts[node_named(cluster, n).node_id])
    node = node_named(cluster, name)
    moved = counts[node.node_id]
    removed = time.monotonic()
    cluster.remove_node(node)
    found = index.search(queries, k=10)
    waited = time.monotonic() - removed
    add_worker_node(cluster, name)
    return {"shards_moved": moved, "of_shards": len(placement), "query_waited_s": round(waited, 2),
            "identical": found.ids == expected.ids and bool(np.array_equal(found.scores, expected.scores))}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = Result(args.name)
    import ray

    from embedlib.data import SAMPLE_DATASET
    from embedlib.search.served import ServedIndex

    work = Path(tempfile.mkdtemp(prefix="search-node-loss-"))
    with local_cluster() as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        url = build(work, args.docs, args.shards)
        started = time.monotonic()
        index = ServedIndex.serve(url, wait_s=300)
        serve_s = time.monotonic() - started
        texts = [q["text"] for q in map(json.loads, open(SAMPLE_DATASET / "queries.jsonl"))][:32]
        queries = index.encode_queries(texts)
        expected = index.search(queries, k=10)
        started = time.monotonic()
        index.search(queries, k=10)
        healthy_s = time.monotonic() - started
        trials = [trial(cluster, index, queries, expected) for _ in range(args.trials)]
        for row in trials:
            print(row, flush=True)
        ray.shutdown()
    result.write({
        "cluster": "head + 2 worker nodes (bench/local_cluster.py), 1 CPU each",
        "docs": args.docs, "shards": args.shards, "queries": len(texts), "k": 10,
        "serve_s": round(serve_s, 2), "healthy_query_s": round(healthy_s, 3),
        "trials": trials,
        "all_identical": all(t["identical"] for t in trials),
        "median_query_waited_s": float(np.median([t["query_waited_s"] for t in trials])),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
