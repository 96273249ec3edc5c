"""Merge two checkpoints tensor by tensor (SLERP or linear); with ``sweep``, choose the weight on dev data.

python jobs/merge.py --config jobs/configs/tiny-merge.yaml
python jobs/merge.py --config jobs/configs/minilm-general-merge.yaml   # sweep base -> fine-tuned on dev queries

YAML: ``first``, ``second``, ``output``, ``t``, ``method`` (slerp | linear), ``layer_scaling`` (none | linear: layer
i of L moves t·i/(L - 1), the embeddings stay at ``first``). A sweep (``sweep: [0.3, 0.5, ...]``)
scores each weight on the held-out queries of the ``dev`` sources (the training config's sources with the
same ``holdout``: never trained on, never the test sets), saves the best at ``output`` and writes the curve
beside it (``merge_sweep.json``, ``merge_sweep.png``). ``guard`` sources (domains never trained on) cap the weight
where their scores first fall below the base's (``guard_tolerance``; ``guard_rule: bootstrap``: only a fall
outside the guard queries' 95% interval counts). With ``binary_centre_docs`` and ``binary_centre_data``
(the training rows), the merged model gets its own binary centre (codes ``sign(x - c)``). A mistake the user
can fix (config field, checkpoint path) exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.data import resolve_model  # noqa: E402
from embedlib.errors import run_job  # noqa: E402
from embedlib.submitted import check_submitted_paths  # noqa: E402
from embedlib.training.config import MergeConfig, load_merge_config  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """The job's exit status: 0, or 2 for a mistake the user can fix (one line on stderr)."""
    return run_job("merge", lambda: merge(argv))


def run_sweep(cfg: MergeConfig) -> tuple[dict, bytes]:
    """Score every weight of ``cfg.sweep`` on the dev sets: the report (curve, chosen weight) and its PNG."""
    from embedlib.training.merge import best_weight, guard_change, guard_limit, sweep
    from embedlib.training.mixture import heldout_dataset, unseen_dataset
    from embedlib.training.plots import merge_curve_png

    dev_sets = {source.name: (heldout_dataset(source, cfg.dev_max_docs), source.kind == "q2q") for source in cfg.dev}
    guard_sets = {s.name: (unseen_dataset(s, cfg.dev_max_docs), s.kind == "q2q") for s in cfg.guard or []}
    curve = sweep(cfg.first, cfg.second, cfg.sweep, dev_sets, cfg.method, cfg.max_length, cfg.quantization, cfg.cache,
                  guard_sets, cfg.layer_scaling)
    chosen = best_weight(curve, cfg.keep_gain, cfg.guard_tolerance, cfg.guard_rule)
    if guard_sets:
        start = next(point for point in curve if point["t"] == 0.0)
        for point in curve:
            point["guard_change"] = {
                name: dict(zip(("change", "low", "high"), guard_change(start, point, name), strict=True))
                for name in guard_sets
            }
    every_set = dev_sets | guard_sets
    report = {
        "first": cfg.first,
        "second": cfg.second,
        "method": cfg.method,
        "layer_scaling": cfg.layer_scaling,
        "quantization": cfg.quantization,
        "metric": {name: "recall@10" if q2q else "ndcg@10" for name, (_, q2q) in every_set.items()},
        "dev_queries": {name: len(dataset.qrels) for name, (dataset, _) in every_set.items()},
        "dev_docs": {name: len(dataset.corpus) for name, (dataset, _) in every_set.items()},
        "curve": curve,
        "keep_gain": cfg.keep_gain,
        "guard_tolerance": cfg.guard_tolerance if guard_sets else None,
        "guard_rule": cfg.guard_rule if guard_sets else None,
        "guard_limit": guard_limit(curve, cfg.guard_tolerance, cfg.guard_rule) if guard_sets else None,
        "chosen_t": chosen,
        "output": cfg.output,
    }
    return report, merge_curve_png(curve, chosen, f"dev score ({cfg.quantization})")


def merge(argv: list[str] | None) -> int:
    cfg = load_merge_config(parse_args(argv).config)
    cfg.first, cfg.second = resolve_model(cfg.first), resolve_model(cfg.second)
    check_submitted_paths({"first": cfg.first, "second": cfg.second, "output": cfg.output,
                           "binary_centre_data": cfg.binary_centre_data})
    from embedlib import storage
    from embedlib.training.merge import merge_checkpoints  # torch: once the config is valid

    if cfg.sweep:
        report, png = run_sweep(cfg)
        for point in report["curve"]:
            scores = " ".join(f"{name} {value:.4f}" for name, value in (point["scores"] | point.get("guard", {})).items())
            changes = "".join(f" | {name} {c['change']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]"
                              for name, c in point.get("guard_change", {}).items())
            print(f"t={point['t']:g}: {scores} mean {point['mean']:.4f}{changes}")
        cfg.t = report["chosen_t"]
    merged = merge_checkpoints(cfg.first, cfg.second, cfg.output, cfg.t, cfg.method, cfg.layer_scaling)
    if cfg.binary_centre_docs:
        from embedlib.training.centre import fit_binary_centre

        fit_binary_centre(cfg.output, cfg.binary_centre_data, cfg.binary_centre_docs)
    if cfg.sweep:
        storage.write_bytes_atomic(storage.join(cfg.output, "merge_sweep.json"), json.dumps(report, indent=1).encode())
        storage.write_bytes_atomic(storage.join(cfg.output, "merge_sweep.png"), png)
    print(
        f"merged {cfg.first} and {cfg.second} ({cfg.method}) at t={cfg.t:g} into {cfg.output} "
        f"(weights {merged.weights_hash[:12]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
