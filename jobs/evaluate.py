"""Evaluate models and baselines: ``ray job submit --working-dir . -- python jobs/evaluate.py --dataset URL ...``.

Q2D (default), Q2Q (``--q2q``: a query never retrieves itself) or bitext mining (``--bitext TATOEBA_URL``);
every model in float/int8/binary side by side with BM25 and published indexes (``--method diffretriever``:
diffusion LMs' multi-vector dense, sparse and hybrid scores per K_q instead); ``--distractors URL --scale
1,10,100`` grows the corpus and reports how recall falls. Writes metrics.json, per_query.json, report.md and
PNG plots under ``--out`` (any fsspec URL). ``--model all-MiniLM-L6-v2`` is the embedded default model. A
mistake the user can fix (flag, config, dataset, model path) exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.config import values_from_args  # noqa: E402
from embedlib.data import resolve_model  # noqa: E402
from embedlib.errors import run_job  # noqa: E402
from embedlib.eval.config import EvalConfig, model_name  # noqa: E402
from embedlib.submitted import check_submitted_paths  # noqa: E402


def comma_list(kind):
    return lambda text: [kind(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML file with EvalConfig fields (flags override it)")
    parser.add_argument("--dataset", help="BEIR-layout folder (jsonl or parquet), any fsspec URL")
    parser.add_argument("--split", help="qrels split (default: test)")
    parser.add_argument("--q2q", action="store_true", default=None, help="query-to-query: ignore identical ids")
    parser.add_argument("--model", dest="models", action="append",
                        help="checkpoint PATH_OR_URL or NAME=PATH_OR_URL (repeatable)")
    parser.add_argument("--method", choices=["dense", "diffretriever"],
                        help="dense (default): pooled vectors; diffretriever: K mask tokens of a diffusion LM")
    parser.add_argument("--k-query", type=comma_list(int), help="diffretriever: K_q values, e.g. 1,4 (default 4)")
    parser.add_argument("--k-passage", type=int, help="diffretriever: K_p (default 16)")
    parser.add_argument("--modes", type=comma_list(str), help="diffretriever: dense,sparse,hybrid (default: all)")
    parser.add_argument("--dense-weight", type=float, help="diffretriever hybrid: weight of dense (default 0.5)")
    parser.add_argument("--quantization", dest="quantizations", type=comma_list(str),
                        help="comma list of float,int8,binary (default: all three)")
    parser.add_argument("--dim", type=int, help="Matryoshka dimension")
    parser.add_argument("--bm25", action="store_true", default=None, help="add the bm25s baseline")
    parser.add_argument("--ann", action="store_true", default=None,
                        help="also search each model with an in-process HNSW and report its recall vs exact")
    parser.add_argument("--index", dest="indexes", action="append", help="published ShardedIndex URL (repeatable)")
    parser.add_argument("--distractors", help="text folder or parquet corpus to grow the corpus with")
    parser.add_argument("--scale", dest="scales", type=comma_list(float), help="corpus size factors, e.g. 1,10,100")
    parser.add_argument("--scale-index", help="grow the corpus through the indexing pipeline: index root URL")
    parser.add_argument("--distractor-max-words", type=int, help="words per distractor paragraph (default 48)")
    parser.add_argument("--bitext", help="Tatoeba folder for bitext mining (accuracy@1 both directions)")
    parser.add_argument("--langs", type=comma_list(str), help="bitext languages, e.g. deu,fra (default: all)")
    parser.add_argument("--cache", help="embedding cache URL, reused across runs")
    parser.add_argument("--max-length", type=int, help="model max tokens")
    parser.add_argument("--out", help="report folder, any fsspec URL")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def named_model(spec: str) -> str:
    """``NAME=PATH_OR_URL`` with the embedded default model's name (``all-MiniLM-L6-v2``) resolved to its folder;
    the system keeps the name the user gave."""
    name, path = model_name(spec)
    resolved = resolve_model(path)
    return spec if resolved == path else f"{name}={resolved}"


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The validated config: ``--config`` YAML, then the flags over it; model names resolved."""
    values = values_from_args(EvalConfig, args)
    config = EvalConfig.from_dict(values)
    check_submitted_paths(
        {"out": config.out, "dataset": config.dataset, "distractors": config.distractors,
         "scale_index": config.scale_index, "bitext": config.bitext}
        | {f"models[{i}]": model_name(spec)[1] for i, spec in enumerate(config.models)}
        | {f"indexes[{i}]": url for i, url in enumerate(config.indexes)}
    )
    config.models = [named_model(spec) for spec in config.models]
    return config


def main(argv: list[str] | None = None) -> int:
    """The job's exit status: 0, or 2 for a mistake the user can fix (one line on stderr)."""
    return run_job("evaluate", lambda: evaluate(argv))


def evaluate(argv: list[str] | None) -> int:
    config = config_from_args(parse_args(argv))
    from embedlib.eval.job import run_evaluation  # torch and the models: once the config is valid
    from embedlib.eval.report import report_markdown

    document = run_evaluation(config)
    print(report_markdown(document))
    print(f"\nreport written to {config.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
