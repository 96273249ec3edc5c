"""Search speed of a flat binary shard served centred (float queries ``x - c`` against ``sign(x - c)`` codes,
scanned exactly) against Hamming over the same codes (FAISS ``IndexBinaryFlat``), Hamming candidates re-scored
(what IVF/HNSW binary shards do), and a flat INT8 scan; recall@10 of each against the exact centred scan.

    python bench/binary_scan.py                      # 1M x 384-d (MiniLM's width), 64 queries
    python bench/binary_scan.py --n 200000 --queries 32   # quicker

Synthetic embeddings: clustered Gaussians plus a large offset shared by every vector (as MiniLM's have), so
``sign(x)`` would waste bits on it; the centre is the mean of 2,048 of them, as training fits one. One thread
count for all (``--threads``). Every figure is the median of ``--repeats`` timed runs after one warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import faiss
import numpy as np
import torch
from result_file import parse_with_result

from embedlib.encoding.formats import binary_queries, centred
from embedlib.encoding.quantize import quantize_int8
from embedlib.index.faiss_shards import exhaustive, faiss_queries, flat_index, rescore


def synthetic(n: int, dim: int, clusters: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-length float32 ``(n, dim)``: cluster centres plus noise plus one offset shared by all."""
    offset = rng.normal(0, 1.0, dim).astype(np.float32)
    centres = rng.normal(0, 0.6, (clusters, dim)).astype(np.float32)
    out = np.empty((n, dim), np.float32)
    for first in range(0, n, 100_000):
        m = min(100_000, n - first)
        x = offset + centres[rng.integers(0, clusters, m)] + rng.normal(0, 0.5, (m, dim)).astype(np.float32)
        out[first : first + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def timed(search, repeats: int) -> tuple[float, object]:
    """Median seconds of ``search()`` over ``repeats`` runs after a warm-up, and its last result."""
    found = search()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        found = search()
        times.append(time.perf_counter() - start)
    return statistics.median(times), found


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f[:10]) & set(e[:10])) / 10 for f, e in zip(found, exact, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=64)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--rerank-factor", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args, result = parse_with_result(parser, "binary_scan")
    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    docs = synthetic(args.n, args.dim, args.clusters, rng)
    queries = docs[rng.choice(args.n, args.queries, replace=False)] + rng.normal(0, 0.02, (args.queries, args.dim))
    centre = docs[rng.choice(args.n, 2048, replace=False)].mean(axis=0)
    codes = np.packbits(centred(docs, centre) > 0, axis=-1)
    int8 = quantize_int8(torch.from_numpy(docs * np.sqrt(args.dim) / 4)).numpy()  # MiniLM-like tanh range
    del docs
    float_queries = binary_queries(queries, centre)
    hamming = flat_index(codes, "binary")
    k, fetch = 10, 10 * args.rerank_factor

    exact_s, exact = timed(lambda: exhaustive(float_queries, codes, k, "binary"), args.repeats)
    packed = faiss_queries(float_queries, "binary", {})
    hamming_s, (_, by_hamming) = timed(lambda: hamming.search(packed, k), args.repeats)

    def hamming_then_rescore():
        _, candidates = hamming.search(packed, fetch)
        return rescore(float_queries, codes, candidates.astype(np.int64), "binary", k)

    rerank_s, reranked = timed(hamming_then_rescore, args.repeats)
    int8_s, _ = timed(lambda: exhaustive(queries.astype(np.float32), int8, k, "int8"), args.repeats)
    rows = {
        "centred exact scan (flat shard)": (exact_s, 1.0, codes.shape[1]),
        "Hamming (IndexBinaryFlat, sign bits of the query)": (hamming_s, recall_at_10(by_hamming, exact.positions),
                                                              codes.shape[1]),
        f"Hamming top-{fetch}, re-scored centred (IVF/HNSW path)": (
            rerank_s, recall_at_10(reranked.positions, exact.positions), codes.shape[1]),
        "INT8 exact scan (reference)": (int8_s, None, int8.shape[1]),
    }
    figures = {
        "n": args.n, "dim": args.dim, "queries": args.queries, "threads": args.threads,
        "methods": {name: {"seconds": round(s, 4), "ms_per_query": round(1000 * s / args.queries, 3),
                           "qps": round(args.queries / s, 1), "recall@10_vs_centred_exact": r,
                           "bytes_per_doc": b}
                    for name, (s, r, b) in rows.items()},
    }
    for name, row in figures["methods"].items():
        recall = row["recall@10_vs_centred_exact"]
        print(f"{name}: {row['ms_per_query']:.2f} ms/query ({row['qps']:.0f} QPS)"
              + ("" if recall is None else f", recall@10 vs exact {recall:.3f}"))
    result.write(figures)


if __name__ == "__main__":
    main()
