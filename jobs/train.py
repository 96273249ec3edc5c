"""Contrastive training stage (pair | contextual | triplet | diffretriever) from a YAML config, on Ray Train +
DeepSpeed.

    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/tiny-pair.yaml
    python jobs/train.py --config jobs/configs/tiny-triplet.yaml --prepare-beir ../shared/data/scifact \\
        --negatives bm25 --set optimizer.lr=5e-5
    python jobs/train.py --stage diffretriever --config jobs/configs/tiny-diffretriever.yaml \\
        --prepare-beir ../shared/data/scifact
    python jobs/train.py --config jobs/configs/tiny-contextual.yaml --prepare-beir ../shared/data/scifact

``--prepare-beir`` first writes the config's ``data.url`` from a BEIR-layout dataset (qrels -> pairs,
plus hard negatives mined with BM25 or an embedding model for triplets, and for diffretriever with
``hard_negatives > 0``; for contextual, each relevant document in sentence chunks with the BM25-best chunk
as gold).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.encoding.encoder import Encoder  # noqa: E402
from embedlib.eval.beir import load_beir  # noqa: E402
from embedlib.training.config import ConfigError, TrainConfig, load_config, parse_overrides  # noqa: E402
from embedlib.training.data import (  # noqa: E402
    beir_contextual_rows,
    beir_pairs,
    mine_bm25_negatives,
    mine_embedding_negatives,
    row_format,
    write_rows,
)
from embedlib.training.runner import train  # noqa: E402


def prepare_beir(cfg: TrainConfig, url: str, split: str, negatives: str) -> None:
    """Write ``cfg.data.url`` from a BEIR dataset: shuffled pairs, triplets with mined negatives, or
    contextual rows (relevant documents in sentence chunks, the BM25-best chunk gold)."""
    dataset = load_beir(url, split)
    rows = row_format(cfg.stage, cfg.hard_negatives)
    examples = beir_contextual_rows(dataset) if rows == "contextual" else beir_pairs(dataset)
    random.Random(cfg.seed).shuffle(examples)
    if rows == "triplet":
        if negatives == "bm25":
            examples = mine_bm25_negatives(examples, dataset, k=cfg.hard_negatives)
        else:
            encoder = Encoder.from_pretrained(negatives.removeprefix("model:"))
            examples = mine_embedding_negatives(examples, dataset, encoder, k=cfg.hard_negatives)
    write_rows(examples, cfg.data.url)
    print(f"wrote {len(examples)} {rows} rows to {cfg.data.url}")


def main(stages: tuple[str, ...] = ("pair", "contextual", "triplet", "diffretriever")) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML training config (local path or URL)")
    parser.add_argument("--stage", choices=stages, help="must match the config's stage when given")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    parser.add_argument("--prepare-beir", metavar="URL", help="write data.url from this BEIR dataset first")
    parser.add_argument("--split", default="train")
    parser.add_argument("--negatives", default="bm25", help="bm25 or model:<checkpoint> (triplets)")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)
    if args.stage:
        overrides["stage"] = args.stage
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as err:
        raise SystemExit(f"{args.config}: {err}") from None
    if cfg.stage not in stages:
        raise SystemExit(f"{args.config}: stage {cfg.stage!r} is not one of {stages}")
    if args.prepare_beir:
        prepare_beir(cfg, args.prepare_beir, args.split, args.negatives)
    ray.init()
    result = train(cfg)
    last = result.history[-1] if result.history else {}
    print(
        f"{cfg.stage}: {result.steps} steps, final loss {last.get('loss', float('nan')):.4f}; "
        f"model at {result.output} (metrics.csv, loss.png beside it)"
    )


if __name__ == "__main__":
    main()
