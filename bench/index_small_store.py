"""Memory pressure: the streaming index build with a small Ray object store (default 200 MiB) completes.

    python bench/index_small_store.py                          # 100k documents, 200 MiB object store
    python bench/index_small_store.py --documents 100000 --object-store-mb 80 --name index_small_store_80

The corpus, model, S3 endpoint (moto server) and the build in a fresh driver process are ``index_scale.py``'s.
Reports the object store's peak use and spilled bytes (Ray's memory summary, sampled every second), the wall
time, and checks that every document of the corpus is in the published index exactly once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from index_scale import BUCKET, corpus, read_back_ids, run_build, start_environment, write_corpus  # noqa: E402
from result_file import Result  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--object-store-mb", type=int, default=200)
    parser.add_argument("--shard-size", type=int, default=50_000)
    parser.add_argument("--batch-rows", type=int, default=8192)
    parser.add_argument("--name", default="index_small_store")
    args = parser.parse_args()
    result = Result(args.name)
    import ray

    server, model, env = start_environment(args.object_store_mb, prefix="index-small-store-")
    ids, texts = corpus(args.documents)
    input_url, output = f"s3://{BUCKET}/corpus-{args.documents}", f"s3://{BUCKET}/index-{args.documents}"
    write_corpus(input_url, ids, texts)
    del texts
    figures = run_build(input_url, output, model, args, env)
    found = read_back_ids(output)
    figures |= {
        "documents": args.documents,
        "object_store_memory_bytes": args.object_store_mb * 2**20,
        "shard_size": args.shard_size, "batch_rows": args.batch_rows,
        "model": "tiny random BERT (real format, embedlib.models.tiny)", "endpoint": "moto server (S3 over HTTP)",
        "completed": True,
        "every_id_exactly_once": len(found) == len(set(found)) and set(found) == set(ids),
        "spilled": figures["spilled_bytes"] > 0,
    }
    result.write(figures)
    print(json.dumps(figures, indent=2))
    ray.shutdown()
    server.stop()


if __name__ == "__main__":
    main()
