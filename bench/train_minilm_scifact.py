"""Acceptance 1: pair then triplet training of all-MiniLM-L6-v2 on SciFact train (INT8 straight-through,
BM25-mined hard negatives) through the Ray Train + DeepSpeed runner; SciFact test and NFCorpus test nDCG@10
before and after, through the INT8 path.

    python bench/train_minilm_scifact.py --max-length 128     # the measured run: 128-token training documents
    # evaluation again (and any stage not yet saved under --work)
    python bench/train_minilm_scifact.py --reuse --max-length 128 --eval-max-length 256
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

import ray
import torch
from eval_common import EVAL_CACHE
from result_file import parse_with_result
from train_common import retrieval_scores

from embedlib.data import default_model_path
from embedlib.encoding.encoder import Encoder
from embedlib.eval.beir import load_beir
from embedlib.training.config import TrainConfig, from_dict
from embedlib.training.data import beir_pairs, mine_bm25_negatives, write_rows
from embedlib.training.plots import loss_curves_png
from embedlib.training.runner import train

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def stage_config(stage: str, model: str, output: str, data: str, args) -> TrainConfig:
    return from_dict(
        TrainConfig,
        {
            "stage": stage,
            "model": model,
            "output": output,
            "run_name": f"minilm-{stage}-{int(time.time())}",
            "data": {"url": data, "max_length": args.max_length, "query_max_length": 64},
            "batch_size": args.batch_size,
            "epochs": getattr(args, f"{stage}_epochs"),
            "optimizer": {"lr": getattr(args, f"{stage}_lr"), "warmup_steps": 3, "schedule": "linear"},
            "deepspeed": {"zero_stage": 2, "precision": "fp32"},
            "scaling": {"num_workers": 1, "cpus_per_worker": 1, "torch_threads": args.torch_threads},
            "checkpoint_every": 1000,
        },
    )


def run_stage(stage: str, model: str, work: Path, args):
    """Train ``stage`` from ``model`` into ``WORK/<stage>``, or with ``--reuse`` read what a run saved there."""
    saved = work / stage / "metrics.json"
    if args.reuse and saved.exists():
        history = json.loads(saved.read_text())
        print(f"reusing {work / stage} ({history[-1]['step']} {stage} steps)")
        return SimpleNamespace(history=history, steps=history[-1]["step"])
    data = work / ("pairs.parquet" if stage == "pair" else "triplets.parquet")
    return train(stage_config(stage, model, str(work / stage), str(data), args))


def score(model: str, dataset: str, args) -> dict[str, float]:
    encoder = Encoder.from_pretrained(model, device="cpu", max_length=args.eval_max_length)
    result = retrieval_scores(encoder, str(DATA / dataset), "test", cache=args.cache, name=dataset)
    print(f"{model} on {dataset}: {json.dumps(result)}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", default="/tmp/embedlib-bench/minilm")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pair-epochs", type=int, default=2)
    parser.add_argument("--pair-lr", type=float, default=3e-5)
    parser.add_argument("--triplet-epochs", type=int, default=1)
    parser.add_argument("--triplet-lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=256, help="training token cap for documents")
    parser.add_argument(
        "--eval-max-length", type=int, default=256, help="evaluation token cap, the same before and after"
    )
    parser.add_argument("--torch-threads", type=int, default=2, help="threads of the one training worker")
    parser.add_argument(
        "--reuse", action="store_true", help="skip a stage whose model an earlier run saved under WORK"
    )
    parser.add_argument(
        "--cache",
        default=EVAL_CACHE,
        help="embedding cache shared with the evaluation benches (keyed by weights hash)",
    )
    args, result = parse_with_result(parser, "train_minilm_scifact")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    train_set = load_beir(str(DATA / "scifact"), "train")
    pairs = beir_pairs(train_set)
    random.Random(0).shuffle(pairs)
    triplets = mine_bm25_negatives(pairs, train_set, k=3)
    write_rows(pairs, str(work / "pairs.parquet"))
    write_rows(triplets, str(work / "triplets.parquet"))
    print(f"SciFact train: {len(pairs)} pairs, {len(triplets)} triplets with 3 BM25 negatives")

    base = str(default_model_path())
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    pair = run_stage("pair", base, work, args)
    triplet = run_stage("triplet", str(work / "pair"), work, args)
    torch.set_num_threads(args.torch_threads)  # training is over: the driver encodes for evaluation
    before, after = {}, {}
    for name in ("scifact", "nfcorpus-test"):  # the SciFact pair first: the headline figure
        after[name] = score(str(work / "triplet"), name, args)
        before[name] = score(base, name, args)
    (work / "losses.png").write_bytes(loss_curves_png({"pair": pair.history, "triplet": triplet.history}))
    tokens_per_s = [r["tokens_per_s"] for r in pair.history + triplet.history]
    summary = {
        "args": vars(args),
        "before": before,
        "after": after,
        "pair_steps": pair.steps,
        "triplet_steps": triplet.steps,
        "median_tokens_per_s": sorted(tokens_per_s)[len(tokens_per_s) // 2],
        "wall_s": time.time() - started,
    }
    result.write(summary)
    print(f"{'dataset':<16}{'nDCG@10 before':>16}{'nDCG@10 after':>16}")
    for name in before:
        print(f"{name:<16}{before[name]['ndcg@10']:>16.4f}{after[name]['ndcg@10']:>16.4f}")
    print(
        f"steps: pair {pair.steps}, triplet {triplet.steps}; wall {summary['wall_s']:.0f} s; "
        f"loss curves {work / 'losses.png'}"
    )


if __name__ == "__main__":
    main()
