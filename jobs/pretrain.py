"""Diffusion continued pretraining (pplx-embed §4.2) from a YAML config, on Ray Train + DeepSpeed.

    ray job submit --working-dir . -- python jobs/pretrain.py --config jobs/configs/tiny-pretrain.yaml
    python jobs/pretrain.py --config jobs/configs/tiny-pretrain.yaml --prepare-tiny ../shared/data/text

``--prepare-tiny TEXT_DIR`` writes a tiny random Qwen3 checkpoint at the config's ``model`` path and the
text files of ``TEXT_DIR`` as ``{"text"}`` rows at ``data.url`` (the demo that runs on a CPU in minutes).
A mistake the user can fix (flag, config field, data) exits with status 2 and one line on stderr; the config is
checked before Ray or torch are imported.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.errors import run_job  # noqa: E402
from embedlib.storage import redact_url  # noqa: E402
from embedlib.submitted import check_submitted_paths  # noqa: E402
from embedlib.training.config import ConfigError, TrainConfig, load_config, parse_overrides  # noqa: E402


def prepare_tiny(cfg: TrainConfig, text_dir: str) -> None:
    from embedlib.models.tiny import make_tiny_checkpoint
    from embedlib.training.data import text_rows, write_rows

    files = sorted(p for p in Path(text_dir).rglob("*") if p.suffix in (".txt", ".tokens"))
    rows = text_rows(files)
    random.Random(cfg.seed).shuffle(rows)
    write_rows(rows, cfg.data.url)
    make_tiny_checkpoint(cfg.model, "qwen3-causal", texts=[r["text"] for r in rows[:2000]])
    print(f"wrote {len(rows)} text rows to {cfg.data.url} and a tiny Qwen3 at {cfg.model}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prepare-tiny", metavar="TEXT_DIR")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The validated pretraining config (``--set`` over the YAML); errors name the file and the field."""
    cfg = load_config(args.config, parse_overrides(args.set))
    if cfg.stage != "pretrain":
        raise ConfigError(f"{redact_url(args.config)}: stage must be 'pretrain', got {cfg.stage!r} (use jobs/train.py)")
    check_submitted_paths({"model": cfg.model, "output": cfg.output, "data.url": cfg.data.url,
                           "--prepare-tiny": args.prepare_tiny})
    return cfg


def main(argv: list[str] | None = None) -> int:
    """The job's exit status: 0, or 2 for a mistake the user can fix (one line on stderr)."""
    return run_job("pretrain", lambda: pretrain(argv))


def pretrain(argv: list[str] | None) -> int:
    args = parse_args(argv)
    cfg = config_from_args(args)
    if args.prepare_tiny:
        prepare_tiny(cfg, args.prepare_tiny)
    import ray

    from embedlib.training.runner import train

    ray.init()
    result = train(cfg)
    last = result.history[-1] if result.history else {}
    print(
        f"pretrain: {result.steps} steps, loss {last.get('loss', float('nan')):.4f}, masked accuracy "
        f"{last.get('masked_accuracy', float('nan')):.3f}; model at {result.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
