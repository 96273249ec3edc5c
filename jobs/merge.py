"""SLERP-merge two checkpoints tensor by tensor (YAML config: first, second, output, t).

python jobs/merge.py --config jobs/configs/tiny-merge.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a ray job's working dir

from embedlib.training.config import load_merge_config  # noqa: E402
from embedlib.training.merge import merge_checkpoints  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True)
    cfg = load_merge_config(parser.parse_args().config)
    merged = merge_checkpoints(cfg.first, cfg.second, cfg.output, cfg.t)
    print(
        f"merged {cfg.first} and {cfg.second} at t={cfg.t} into {cfg.output} (weights {merged.weights_hash[:12]})"
    )


if __name__ == "__main__":
    main()
