"""Index a corpus: ``ray job submit --working-dir . -- python jobs/index.py --input URL --output URL ...``.

With no arguments: the bundled Cranfield sample, the default model (all-MiniLM-L6-v2), local Ray, output in
``./outputs/index``; it then prints nDCG@10 of the published index on the sample's judged queries.
Under ``ray job submit`` the working dir is copied: give ``--input``/``--output`` as absolute paths or URLs.
A mistake the user can fix (flag, config field, input, model or output location) exits with status 2 and one
line on stderr; flags and the config are checked before Ray or torch are imported.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.config import values_from_args  # noqa: E402
from embedlib.data import SAMPLE_DATASET, resolve_model  # noqa: E402
from embedlib.errors import run_job  # noqa: E402
from embedlib.index.config import IndexJobConfig  # noqa: E402
from embedlib.submitted import check_submitted_paths  # noqa: E402

DEFAULT_OUTPUT = "outputs/index"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="YAML file with IndexJobConfig fields (flags override it)")
    parser.add_argument(
        "--input", help="jsonl/parquet file or folder, any fsspec URL (default: bundled Cranfield)"
    )
    parser.add_argument("--output", help=f"index root URL (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--model", help="checkpoint folder or URL, or all-MiniLM-L6-v2 (the default: the "
                                         "embedded model)")
    parser.add_argument("--method", choices=["dense", "diffretriever"],
                        help="dense (default): one pooled vector per doc; diffretriever: K_p mask-token vectors "
                             "+ a sparse vector per doc from a diffusion LM")
    parser.add_argument("--k-passage", type=int, help="diffretriever: mask tokens per document (default 16)")
    parser.add_argument("--k-query", type=int, help="diffretriever: mask tokens per query (default 4)")
    parser.add_argument("--top-terms", type=int, help="diffretriever: terms kept per sparse vector (default 128)")
    parser.add_argument("--quantization", choices=["int8", "binary", "float"])
    parser.add_argument("--dim", type=int, help="Matryoshka dimension")
    parser.add_argument("--index-type", choices=["flat", "ivf", "hnsw"])
    parser.add_argument("--shard-size", type=int, help="documents per shard")
    parser.add_argument("--id-column")
    parser.add_argument("--text-column")
    parser.add_argument("--title-column")
    parser.add_argument(
        "--chunk-tokens", type=int, help="late chunking: embed each doc once, pool N-token chunks"
    )
    parser.add_argument("--actors", type=int, help="encoder actors")
    parser.add_argument("--cpus-per-actor", type=float)
    parser.add_argument("--gpus-per-actor", type=float)
    parser.add_argument("--strict", action="store_true", default=None, help="fail on any rejected row")
    parser.add_argument("--allow-shrink", action="store_true", default=None,
                        help="publish even if the new version keeps under half of the current one's documents")
    parser.add_argument("--keep-versions", type=int, help="published versions kept (default 3)")
    parser.add_argument("--keep-recent-hours", type=float,
                        help="never delete a version published less than this long ago (default 24)")
    parser.add_argument("--lease-seconds", type=float,
                        help="the publish lease on the output lasts this long unless renewed (default 60)")
    parser.add_argument("--lease-wait-seconds", type=float,
                        help="when another build holds the output, wait this long for it before failing (default 0)")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> IndexJobConfig:
    """The validated config: ``--config`` YAML, then the flags over it; the default model's name resolved."""
    values = values_from_args(IndexJobConfig, args)
    values.setdefault("input", str(SAMPLE_DATASET / "corpus.jsonl"))
    values.setdefault("output", DEFAULT_OUTPUT)
    cfg = IndexJobConfig.from_dict(values)
    if cfg.model:
        cfg.model = resolve_model(cfg.model)  # the default model's name becomes its installed folder
    check_submitted_paths({"input": cfg.input, "output": cfg.output, "model": cfg.model})
    return cfg


def evaluate_sample(output: str) -> dict[str, float]:
    """nDCG@10 etc. of the published index on the bundled sample's judged queries."""
    from embedlib.eval.beir import load_beir
    from embedlib.eval.metrics import evaluate_run, run_from_hits
    from embedlib.index.sharded import ShardedIndex

    dataset = load_beir(str(SAMPLE_DATASET))
    queries = dataset.judged_queries()
    run = run_from_hits(list(queries), ShardedIndex.open(output).search(list(queries.values()), k=100))
    means, _ = evaluate_run(dataset.qrels, run, k_values=(10, 100))
    return means


def main(argv: list[str] | None = None) -> int:
    """The job's exit status: 0, or 2 for a mistake the user can fix (one line on stderr)."""
    return run_job("index", lambda: index(argv))


def index(argv: list[str] | None) -> int:
    cfg = config_from_args(parse_args(argv))
    from embedlib.index.build import build_index  # Ray and torch: only once the config is valid

    summary = build_index(cfg)
    print(summary)
    if cfg.input == str(SAMPLE_DATASET / "corpus.jsonl") and cfg.chunk_tokens is None:
        means = evaluate_sample(cfg.output)
        print(
            f"retrieval on the bundled sample ({SAMPLE_DATASET.name}): nDCG@10 {means['ndcg@10']:.4f}, "
            f"recall@100 {means['recall@100']:.4f}, MRR@10 {means['mrr@10']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
