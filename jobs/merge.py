"""SLERP-merge two checkpoints tensor by tensor (YAML config: first, second, output, t).

python jobs/merge.py --config jobs/configs/tiny-merge.yaml

A mistake the user can fix (config field, checkpoint path) exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.errors import run_job  # noqa: E402
from embedlib.submitted import check_submitted_paths  # noqa: E402
from embedlib.training.config import load_merge_config  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """The job's exit status: 0, or 2 for a mistake the user can fix (one line on stderr)."""
    return run_job("merge", lambda: merge(argv))


def merge(argv: list[str] | None) -> int:
    cfg = load_merge_config(parse_args(argv).config)
    check_submitted_paths({"first": cfg.first, "second": cfg.second, "output": cfg.output})
    from embedlib.training.merge import merge_checkpoints  # torch: once the config is valid

    merged = merge_checkpoints(cfg.first, cfg.second, cfg.output, cfg.t)
    print(
        f"merged {cfg.first} and {cfg.second} at t={cfg.t} into {cfg.output} (weights {merged.weights_hash[:12]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
