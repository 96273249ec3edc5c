"""Issue 13: a merge guard that stops at a real fall of a guard set, not at a dip inside its queries' noise.

The merge's guard caps the interpolation weight where a guard set (a domain the model never trained on) falls
from its t = 0 score. By score (``guard_rule: score``, ``guard_tolerance: 0``) it stopped two of the recommended
recipe's three seeds at t = 0, the base itself, on wikitext dips of 0.0006 and 0.0015. By ``guard_rule: bootstrap``
a fall counts only when the paired-bootstrap 95% interval of the guard queries' change lies wholly below zero.
This bench scores each case's guard sets at every weight of the merge grid, query by query, and reports where
each rule caps the weight and what ``keep90-dev2000`` (keep 90% of the best mean dev gain) then chooses:

- ``seed0`` / ``seed1``: the recommended recipe's models (quality-table rows
  ``multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus[-seed1]``) with the table's guard sets (Quora's training
  groups, wikitext-2 test spans). Their dev curve is the one their ``-merged-keep90-dev2000`` merge swept (its
  ``merge_sweep.json``), so only the guard sets are scored here.
- ``single``: a recipe that forgets (row ``single``: SciFact train alone, one epoch, no anchor; at 128 tokens
  NFCorpus test -0.015, Cranfield -0.012, CISI -0.017): dev = SciFact's held-out training queries, guard =
  NFCorpus dev, a domain it never trained on. Swept whole (dev and guard) by ``embedlib.training.merge.sweep``;
  the row's model is trained first when missing (about 4 min). The models merged at the weights the rules choose
  are then evaluated on the quality table's five sets (at 128 tokens, the length the row was trained for), with
  each set's INT8 change vs the base and its paired-bootstrap 95% interval.

    python bench/guard_rules.py                 # every case
    python bench/guard_rules.py --cases single

Each case's curve is kept under ``--work`` (``guard-curve-<case>.json``, per-query scores included), so a rerun
reads it instead of sweeping again. Writes ``bench/results/guard_rules.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from eval_common import EVAL_CACHE  # noqa: E402
from quality_table import (  # noqa: E402
    DEV2000,
    GUARD_SOURCES,
    MERGE_CONFIG,
    QUORA_HELDOUT,
    WORK,
    eval_sets,
    evaluate_model,
    int8_change_intervals,
    model_path,
)
from result_file import Result  # noqa: E402

from embedlib.config import from_dict  # noqa: E402
from embedlib.data import default_model_path  # noqa: E402
from embedlib.encoding.encoder import Encoder  # noqa: E402
from embedlib.eval.report import figure_png  # noqa: E402
from embedlib.training.config import MergeConfig, SourceConfig, load_merge_config  # noqa: E402
from embedlib.training.merge import (  # noqa: E402
    best_weight,
    guard_change,
    guard_limit,
    guard_scores,
    merge_checkpoints,
    merged_encoder,
    sweep,
)
from embedlib.training.mixture import heldout_dataset, unseen_dataset  # noqa: E402

RECIPE = "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus"
CASES = {"seed0": RECIPE, "seed1": f"{RECIPE}-seed1", "single": "single"}
RULES = ("score", "bootstrap")
KEEP_GAIN = 0.9


def guard_sets(sources: list[dict], max_docs: int) -> dict:
    """Guard sets by name, as the merge job builds them: ``(dataset, is_q2q)``."""
    configs = [from_dict(SourceConfig, source) for source in sources]
    return {s.name: (unseen_dataset(s, max_docs), s.kind == "q2q") for s in configs}


def saved_dev_curve(row: str, work: Path) -> dict[float, float]:
    """t -> mean dev score of the sweep that ``<row>-merged-keep90-dev2000`` was merged by."""
    report = json.loads((work / f"{row}-merged-keep90-dev2000" / "merge_sweep.json").read_text())
    return {point["t"]: point["mean"] for point in report["curve"]}


def guard_curve(second: str, weights: list[float], sets: dict, merge: MergeConfig) -> list[dict]:
    """Each weight's guard scores, query by query, of the base merged with ``second``."""
    other = Encoder.from_pretrained(second, device="cpu", dtype="fp32")
    return [{"t": t} | guard_scores(merged_encoder(str(default_model_path()), other, t, merge.method, merge.max_length),
                                    t, sets, merge.quantization, merge.cache)
            for t in weights]


def case_curve(case: str, work: Path, merge: MergeConfig, args) -> dict:
    """The case's sweep (``curve``: ``t``, ``mean`` dev score, guard scores per query), its ``model``, ``dev`` set
    names and ``guard_queries``; read from ``work`` when an earlier run kept it."""
    kept = work / f"guard-curve-{case}.json"
    if kept.exists():
        return json.loads(kept.read_text())
    weights = DEV2000["sweep"]
    if case == "single":
        second, _ = model_path(CASES[case], work, args)
        scifact, nfcorpus = (source for source in merge.dev if source.name in ("scifact", "nfcorpus"))
        dev = {"scifact": (heldout_dataset(scifact, DEV2000["dev_max_docs"]), False)}
        sets = {"nfcorpus-dev": (unseen_dataset(nfcorpus, DEV2000["dev_max_docs"]), False)}
        curve = sweep(default_model_path(), second, weights, dev, merge.method, merge.max_length, merge.quantization,
                      merge.cache, sets)
    else:
        second = str(work / CASES[case])
        dev = [source.name for source in merge.dev]
        sets = guard_sets(GUARD_SOURCES, DEV2000["dev_max_docs"])
        dev_mean = saved_dev_curve(CASES[case], work)
        curve = [point | {"mean": dev_mean[point["t"]]} for point in guard_curve(second, weights, sets, merge)]
    made = {"model": second, "dev": list(dev), "guard_queries": {name: len(d.qrels) for name, (d, _) in sets.items()},
            "curve": curve}
    kept.write_text(json.dumps(made))
    return made


def summary(curve: list[dict]) -> dict:
    """Per rule, the guard's cap and the keep90 choice under it (and the best-mean choice); per guard set, its score
    and change by weight."""
    start = next(point for point in curve if point["t"] == 0.0)
    unguarded = [{k: v for k, v in p.items() if not k.startswith("guard")} for p in curve]
    return {
        "keep90_without_guard": best_weight(unguarded, KEEP_GAIN),
        "guard_limit": {rule: guard_limit(curve, 0.0, rule) for rule in RULES},
        "chosen_t": {rule: best_weight(curve, KEEP_GAIN, 0.0, rule) for rule in RULES},
        "best_mean_without_guard": best_weight(unguarded),
        "best_mean_chosen_t": {rule: best_weight(curve, None, 0.0, rule) for rule in RULES},
        "dev_mean": {str(p["t"]): round(p["mean"], 4) for p in curve},
        "guard": {name: [dict(zip(("t", "score", "change", "low", "high"),
                                  (p["t"], round(p["guard"][name], 4),
                                   *(round(x, 4) for x in guard_change(start, p, name))), strict=True))
                         for p in curve]
                  for name in start["guard"]},
    }


def evaluate_choices(case: str, figures: dict, work: Path, args) -> dict:
    """The base merged with the case's model at each weight a rule chose, on the five evaluation sets: INT8 score
    and change vs the base (95% interval) per set, keyed by t."""
    weights = sorted({figures["keep90_without_guard"], *figures["chosen_t"].values(), figures["best_mean_without_guard"],
                      *figures["best_mean_chosen_t"].values(), 1.0})
    sets = eval_sets(heldout_dataset(QUORA_HELDOUT))
    base = evaluate_model("base", str(default_model_path()), sets, args)
    out = {}
    for t in weights:
        path = figures["model"] if t == 1.0 else str(work / f"{CASES[case]}-merged-t{t:g}")
        if t not in (0.0, 1.0) and not (Path(path) / "config.json").exists():
            merge_checkpoints(default_model_path(), figures["model"], path, t)
        scores = base if t == 0.0 else evaluate_model(f"{case}@{t:g}", path, sets, args)
        out[str(t)] = {name: {"metric": scores[name]["metric"], "int8": round(scores[name]["int8"], 4)} | change
                       for name, change in int8_change_intervals(base, scores).items()}
    return out


def rules_png(cases: dict[str, dict]) -> bytes:
    """Per case, each guard set's change from t = 0 with its 95% interval, and where each rule stops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.6), squeeze=False)
    for ax, (case, figures) in zip(axes[0], cases.items(), strict=True):
        for offset, (name, points) in enumerate(figures["guard"].items()):
            ts = [p["t"] + 0.01 * offset for p in points]
            ax.errorbar(ts, [p["change"] for p in points], fmt="o-", capsize=3, label=name, markersize=3,
                        yerr=[[p["change"] - p["low"] for p in points], [p["high"] - p["change"] for p in points]])
        for rule, style in zip(RULES, ("--", ":"), strict=True):
            ax.axvline(figures["chosen_t"][rule], color="grey", linestyle=style,
                       label=f"chosen, guard by {rule}: t={figures['chosen_t'][rule]:g}")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(f"{case} (keep90 alone: t={figures['keep90_without_guard']:g})", fontsize=9)
        ax.set_xlabel("t (0: base, 1: fine-tuned)")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("guard score change vs t = 0 (INT8)")
    return figure_png(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--work", default=WORK, help="bench/quality_table.py's --work, where its models are")
    parser.add_argument("--eval-max-length", type=int, default=128, help="token cap of the single case's evaluation")
    parser.add_argument("--cache", default=EVAL_CACHE)
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args()
    args.steps = None  # quality_table.train_row's option: the recipe's own epochs
    import torch

    torch.set_num_threads(args.torch_threads)
    result = Result("guard_rules")
    merge = load_merge_config(str(MERGE_CONFIG))
    figures = {"keep_gain": KEEP_GAIN, "grid": DEV2000["sweep"], "dev_max_docs": DEV2000["dev_max_docs"],
               "max_length": merge.max_length, "quantization": merge.quantization, "cases": {}}
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        started = time.time()
        made = case_curve(case, Path(args.work), merge, args)
        case_figures = {"row": CASES[case], "model": made["model"], "dev": made["dev"],
                        "guard_queries": made["guard_queries"]} | summary(made["curve"])
        print(case, {k: case_figures[k] for k in ("keep90_without_guard", "guard_limit", "chosen_t")}, flush=True)
        if case == "single":
            case_figures["eval_max_length"] = args.eval_max_length
            case_figures["evaluated"] = evaluate_choices(case, case_figures, Path(args.work), args)
        figures["cases"][case] = case_figures | {"wall_s": round(time.time() - started, 1)}
    (result.write(figures).parent / "guard_rules.png").write_bytes(rules_png(figures["cases"]))


if __name__ == "__main__":
    main()
