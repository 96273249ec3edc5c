"""Contrastive training stage (pair | contextual | triplet | diffretriever) from a YAML config, on Ray Train +
DeepSpeed.

    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/tiny-pair.yaml
    python jobs/train.py --config jobs/configs/tiny-triplet.yaml --prepare-beir ../shared/data/scifact \\
        --negatives bm25 --set optimizer.lr=5e-5
    python jobs/train.py --stage diffretriever --config jobs/configs/tiny-diffretriever.yaml \\
        --prepare-beir ../shared/data/scifact
    python jobs/train.py --config jobs/configs/tiny-contextual.yaml --prepare-beir ../shared/data/scifact
    python jobs/train.py --config jobs/configs/minilm-general.yaml --prepare-mixture

``--prepare-mixture`` first writes the config's ``data.url`` from its ``data.sources`` (multi-source rows in
same-source batches, hard negatives mined per source for triplets; ``embedlib.training.mixture``).
``--prepare-beir`` first writes the config's ``data.url`` from a BEIR-layout dataset (qrels -> pairs,
plus hard negatives mined with BM25 or an embedding model for triplets, and for diffretriever with
``hard_negatives > 0``; for contextual, each relevant document in sentence chunks with the BM25-best chunk
as gold). A mistake the user can fix (flag, config field, data) exits with status 2 and one line on stderr;
the config is checked before Ray or torch are imported.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.data import resolve_model  # noqa: E402
from embedlib.errors import run_job  # noqa: E402
from embedlib.storage import redact_url  # noqa: E402
from embedlib.submitted import check_submitted_paths  # noqa: E402
from embedlib.training import config as training_config  # noqa: E402
from embedlib.training.config import ConfigError, TrainConfig, load_config, parse_overrides  # noqa: E402

STAGES = tuple(stage for stage in training_config.STAGES if stage != "pretrain")  # pretrain: jobs/pretrain.py


def prepare_beir(cfg: TrainConfig, url: str, split: str, negatives: str) -> None:
    """Write ``cfg.data.url`` from a BEIR dataset: shuffled pairs, triplets with mined negatives, or
    contextual rows (relevant documents in sentence chunks, the BM25-best chunk gold)."""
    from embedlib.encoding.encoder import Encoder
    from embedlib.eval.beir import load_beir
    from embedlib.training.data import (
        beir_contextual_rows,
        beir_pairs,
        mine_bm25_negatives,
        mine_embedding_negatives,
        row_format,
        write_rows,
    )

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


def prepare_mixture(cfg: TrainConfig) -> None:
    """Write ``cfg.data.url`` from ``cfg.data.sources``."""
    from embedlib.training.data import row_format, write_rows
    from embedlib.training.mixture import build_mixture

    if not cfg.data.sources:
        raise ConfigError("data.sources: --prepare-mixture needs the sources listed in the config")
    rows = row_format(cfg.stage, cfg.hard_negatives)
    if rows not in ("pair", "triplet"):
        raise ConfigError(f"stage: --prepare-mixture writes pair or triplet rows, not {rows} rows")
    negatives = cfg.hard_negatives if rows == "triplet" else 0
    data = cfg.data
    examples = build_mixture(data.sources, data.rows, cfg.batch_size, negatives, data.same_source_batches, cfg.seed)
    write_rows(examples, data.url)
    print(f"wrote {len(examples)} {rows} rows from {len(data.sources)} sources to {data.url}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML training config (local path or URL)")
    parser.add_argument("--stage", choices=STAGES, help="overrides the config's stage")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config fields")
    parser.add_argument("--prepare-beir", metavar="URL", help="write data.url from this BEIR dataset first")
    parser.add_argument("--prepare-mixture", action="store_true", help="write data.url from data.sources first")
    parser.add_argument("--split", default="train")
    parser.add_argument("--negatives", default="bm25", help="bm25 or model:<checkpoint> (triplets)")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The validated config (``--set`` and ``--stage`` over the YAML); errors name the file and the field."""
    overrides = parse_overrides(args.set)
    if args.stage:
        overrides["stage"] = args.stage
    cfg = load_config(args.config, overrides)
    cfg.model = resolve_model(cfg.model)
    if cfg.stage not in STAGES:
        raise ConfigError(f"{redact_url(args.config)}: stage {cfg.stage!r} is not one of {STAGES} (pretrain: jobs/pretrain.py)")
    check_submitted_paths({"model": cfg.model, "output": cfg.output, "data.url": cfg.data.url,
                           "--prepare-beir": args.prepare_beir})
    return cfg


def main(argv: list[str] | None = None) -> int:
    """The job's exit status: 0, or 2 for a mistake the user can fix (one line on stderr)."""
    return run_job("train", lambda: train_stage(argv))


def train_stage(argv: list[str] | None) -> int:
    args = parse_args(argv)
    cfg = config_from_args(args)
    if args.prepare_beir and args.prepare_mixture:
        raise ConfigError("--prepare-beir and --prepare-mixture: give one")
    if args.prepare_beir:
        prepare_beir(cfg, args.prepare_beir, args.split, args.negatives)
    if args.prepare_mixture:
        prepare_mixture(cfg)
    import ray

    from embedlib.training.runner import train

    ray.init()
    result = train(cfg)
    last = result.history[-1] if result.history else {}
    print(
        f"{cfg.stage}: {result.steps} steps, final loss {last.get('loss', float('nan')):.4f}; "
        f"model at {result.output} (metrics.csv, loss.png beside it)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
