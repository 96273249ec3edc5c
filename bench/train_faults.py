"""Fault injection for training tests and benches, driven by marker files instead of sleeps.

The controller-side callback touches ``registered-<step>`` once Ray Train has registered a checkpoint; worker
hooks (``train(after_step=...)``) wait for such markers before they fault, so a fault can never outrun the
checkpoint it is meant to resume from. Pickled by value: Ray workers cannot import the bench folder.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ray
import ray.cloudpickle
from ray.train import UserCallback

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def wait_for_file(path: Path, timeout_s: float = 120) -> None:
    """Return once ``path`` exists; ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.05)


class CheckpointMarkers(UserCallback):
    """On the Ray Train controller: touch ``<folder>/registered-<step>`` once a checkpoint is registered."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def after_report(self, run_context, metrics, checkpoint):
        if checkpoint is not None:
            (self.folder / f"registered-{metrics[0]['step']}").touch()


class KillAfterCheckpoint:
    """Worker hook: in the first attempt, at ``step``, once checkpoint ``checkpointed`` is registered, exit."""

    def __init__(self, folder: Path, step: int, checkpointed: int):
        self.folder, self.step, self.checkpointed = Path(folder), step, checkpointed

    def __call__(self, metrics: dict, rank: int) -> None:
        if "resumed_from_step" not in metrics and metrics["step"] == self.step:
            wait_for_file(self.folder / f"registered-{self.checkpointed}")
            os._exit(1)


class HoldForNodeLoss:
    """Worker hook: in the first attempt, at ``step``, write ``held-rank<r>`` (the worker's node id and the
    step's loss, as JSON) and block until Ray Train ends this worker group (the test removes a node);
    a resumed attempt writes ``resumed-rank<r>`` (the wall time) at its first step and carries on."""

    def __init__(self, folder: Path, step: int, timeout_s: float = 300):
        self.folder, self.step, self.timeout_s = Path(folder), step, timeout_s

    def __call__(self, metrics: dict, rank: int) -> None:
        resumed = "resumed_from_step" in metrics
        if not resumed and metrics["step"] == self.step:
            held = {"node_id": ray.get_runtime_context().get_node_id(), "loss": metrics["loss"]}
            (self.folder / f"held-rank{rank}").write_text(json.dumps(held))
            wait_for_file(self.folder / "never", self.timeout_s)
        marker = self.folder / f"resumed-rank{rank}"
        if resumed and not marker.exists():
            marker.write_text(json.dumps({"time": time.time(), "step": metrics["step"]}))
