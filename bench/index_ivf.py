"""IVF vs exact on synthetic int8 embeddings, and sharded vs unsharded exact search.

    python bench/index_ivf.py                  # 1M x 384-d int8, 8 shards (the acceptance figures)
    python bench/index_ivf.py --n 100000 --queries 200 --nlist 256   # quicker

Prints build time, bytes/vector, QPS and recall@10 vs exact for each nprobe (plot: outputs/bench/index_ivf.png),
and whether 8 flat shards return the same top-10 as one flat index. Synthetic vectors: clustered Gaussians passed
through the encoder's INT8 quantization ``round(127 tanh(x))``, so norms and saturation look like real ones.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from result_file import Result  # noqa: E402

from embedlib.encoding.quantize import quantize_int8  # noqa: E402
from embedlib.index.faiss_shards import (  # noqa: E402
    Shard,
    deserialize,
    shard_index,
    trained_template,
    unit_scale,
)
from embedlib.index.sharded import ShardedIndex  # noqa: E402


def synthetic_int8(n: int, dim: int, clusters: int, seed: int, centers: np.ndarray | None = None):
    """``n`` int8 vectors around ``clusters`` centres (the centres are returned for drawing queries)."""
    rng = np.random.default_rng(seed)
    if centers is None:
        centers = rng.normal(0, 0.6, (clusters, dim)).astype(np.float32)
    out = np.empty((n, dim), np.int8)
    for first in range(0, n, 100_000):
        m = min(100_000, n - first)
        x = centers[rng.integers(0, len(centers), m)] + rng.normal(0, 0.5, (m, dim)).astype(np.float32)
        out[first : first + m] = quantize_int8(torch.from_numpy(x)).numpy()
    return out, centers


def in_memory_index(shards: list[Shard], dim: int, index_type: str) -> ShardedIndex:
    manifest = {
        "base": "<memory>",
        "quantization": "int8",
        "dim": dim,
        "index": {"type": index_type},
        "model": {},
        "shards": [{"rows": len(s.ids)} for s in shards],
    }
    return ShardedIndex(manifest, shards)


def build_shards(vectors: np.ndarray, n_shards: int, index_type: str, params: dict, template: bytes) -> tuple:
    shards, total_bytes = [], 0
    for part, rows in enumerate(np.array_split(np.arange(len(vectors)), n_shards)):
        data = shard_index(template, vectors[rows], "int8", params)
        total_bytes += len(data)
        ids = [str(i) for i in rows]
        shards.append(Shard(ids, vectors[rows], deserialize(data, "int8"), "int8", index_type, params))
        print(f"  shard {part}: {len(rows)} vectors, {len(data) / len(rows):.1f} bytes/vector", flush=True)
    return shards, total_bytes


def recall_at_k(found: list[list[str]], truth: list[list[str]], k: int) -> float:
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--nlist", type=int, default=1024)
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--rerank-factor", type=int, default=4)
    parser.add_argument("--train-sample", type=int, default=65_536)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--plot", default="outputs/bench/index_ivf.png")
    args = parser.parse_args()
    result = Result("index_ivf")

    t = time.perf_counter()
    vectors, centers = synthetic_int8(args.n, args.dim, args.clusters, seed=0)
    queries, _ = synthetic_int8(args.queries, args.dim, args.clusters, seed=1, centers=centers)
    print(
        f"data: {args.n} x {args.dim} int8 ({time.perf_counter() - t:.1f} s to generate), {args.queries} queries"
    )

    print("exact: one flat index (exhaustive cosine) ...", flush=True)
    flat = {"unit_scale": unit_scale(vectors[: args.train_sample])}
    flat_template = trained_template("int8", "flat", args.dim, flat, vectors[:1])
    single = in_memory_index(build_shards(vectors, 1, "flat", flat, flat_template)[0], args.dim, "flat")
    t = time.perf_counter()
    exact = single.search(queries, args.k)
    exact_seconds = time.perf_counter() - t
    print(f"exact search: {args.queries / exact_seconds:.1f} QPS")

    sharded = in_memory_index(
        build_shards(vectors, args.shards, "flat", flat, flat_template)[0], args.dim, "flat"
    )
    found = sharded.search(queries, args.k)
    same = float(np.mean([a == b for a, b in zip(found.ids, exact.ids, strict=True)]))
    print(
        f"sharded flat ({args.shards} shards) vs one flat index: identical top-{args.k} for {same:.4f} of queries, "
        f"max score difference {np.abs(found.scores - exact.scores).max():.2e}"
    )

    t = time.perf_counter()
    sample = vectors[np.random.default_rng(2).permutation(args.n)[: args.train_sample]]
    params = {
        "nlist": args.nlist,
        "nprobe": args.nprobe[0],
        "rerank_factor": args.rerank_factor,
        "unit_scale": unit_scale(sample),
    }
    template = trained_template("int8", "ivf", args.dim, params, sample)
    train_seconds = time.perf_counter() - t
    shards, index_bytes = build_shards(vectors, args.shards, "ivf", params, template)
    build_seconds = time.perf_counter() - t
    ivf = in_memory_index(shards, args.dim, "ivf")
    print(
        f"IVF{args.nlist},SQ8_direct_signed over {args.shards} shards: build {build_seconds:.1f} s "
        f"(train {train_seconds:.1f} s on {len(sample)} vectors), index {index_bytes / args.n:.1f} bytes/vector "
        f"(+ {args.dim} bytes/vector of stored int8 vectors for exact re-scoring)"
    )
    results = []
    for nprobe in args.nprobe:
        t = time.perf_counter()
        ids = ivf.search(queries, args.k, nprobe=nprobe).ids
        qps = args.queries / (time.perf_counter() - t)
        recall = recall_at_k(ids, exact.ids, args.k)
        results.append((nprobe, qps, recall))
        print(
            f"  nprobe {nprobe:4d}: recall@{args.k} vs exact {recall:.4f}, {qps:.1f} QPS "
            f"(batch of {args.queries} queries, in-process, 2 cores)",
            flush=True,
        )

    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r[2] for r in results], [r[1] for r in results], "o-")
    for nprobe, qps, recall in results:
        ax.annotate(f"nprobe={nprobe}", (recall, qps), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axhline(args.queries / exact_seconds, color="gray", ls="--", label="exact (flat)")
    ax.set(
        xlabel=f"recall@{args.k} vs exact",
        ylabel="QPS",
        yscale="log",
        title=f"IVF{args.nlist} int8, {args.n:,} x {args.dim}, {args.shards} shards",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"plot: {args.plot}")
    result.write({
        "args": vars(args), "exact_qps": args.queries / exact_seconds, "sharded_identical_fraction": same,
        "ivf_build_seconds": build_seconds, "ivf_index_bytes_per_vector": index_bytes / args.n,
        "nprobe": [{"nprobe": n, "qps": q, f"recall@{args.k}": r} for n, q, r in results],
    })


if __name__ == "__main__":
    main()
