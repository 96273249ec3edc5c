"""Acceptance 4: tokens/s of the Ray Train + DeepSpeed runner vs. a plain single-process PyTorch loop, same tiny
model, batch, sequence length and thread count (1 worker, 1 thread each); ratio printed from one run.

    python bench/train_throughput.py --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray
from result_file import Result
from train_common import plain_loop

from embedlib.models.tiny import make_tiny_checkpoint
from embedlib.training.config import TrainConfig, from_dict
from embedlib.training.data import text_rows, write_rows
from embedlib.training.runner import train

TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "text"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    args = parser.parse_args()
    result = Result("train_throughput")
    work = Path(tempfile.mkdtemp(prefix="embedlib-throughput-"))
    rows = text_rows([TEXT / "tinyshakespeare.txt"], chars_per_row=1200)
    write_rows(rows, str(work / "text.parquet"))
    model = make_tiny_checkpoint(
        work / "tiny", "qwen3-causal", hidden_size=128, intermediate_size=384, num_hidden_layers=4
    )
    cfg = from_dict(
        TrainConfig,
        {
            "stage": "pretrain",
            "model": str(model),
            "output": str(work / "out"),
            "data": {"url": str(work / "text.parquet"), "max_length": args.max_length},
            "batch_size": args.batch_size,
            "max_steps": args.steps,
            "optimizer": {"lr": 1e-3},
            "deepspeed": {"zero_stage": 2},
            "scaling": {"num_workers": 1, "cpus_per_worker": 1, "torch_threads": 1},
            "checkpoint_every": 10**6,
            "run_name": f"throughput-{int(time.time())}",
        },
    )
    plain = plain_loop(cfg, rows, save=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    runner = train(cfg).history

    def median(history: list[dict]) -> float:
        return statistics.median(r["tokens_per_s"] for r in history[args.warmup :])

    plain_tps, runner_tps = median(plain), median(runner)
    print(
        f"plain PyTorch loop        : {plain_tps:10.0f} tokens/s (median of steps {args.warmup + 1}..{args.steps})"
    )
    print(f"Ray Train + DeepSpeed ZeRO-2: {runner_tps:10.0f} tokens/s")
    print(f"ratio runner / plain      : {runner_tps / plain_tps:.2f}  (acceptance: >= 0.8)")
    result.write({"args": vars(args), "plain_tokens_per_s": plain_tps, "runner_tokens_per_s": runner_tps,
                  "ratio": runner_tps / plain_tps})


if __name__ == "__main__":
    main()
