"""Fault injection for training tests, driven by marker files instead of sleeps.

The controller-side callback touches ``registered-<step>`` once Ray Train has registered a checkpoint; worker
hooks (``train(after_step=...)``) wait for such markers before they fault, so a fault can never outrun the
checkpoint it is meant to resume from. Pickled by value: Ray workers cannot import the tests folder.
"""

from __future__ import annotations

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

    def __call__(self, step: int, rank: int, resumed_from: int | None) -> None:
        if resumed_from is None and step == self.step:
            wait_for_file(self.folder / f"registered-{self.checkpointed}")
            os._exit(1)


class HoldForNodeLoss:
    """Worker hook: in the first attempt, at ``step``, write ``held-rank<r>`` (the worker's node id) and block
    until Ray Train ends this worker group (the test removes a node); resumed attempts write
    ``resumed-rank<r>`` (the wall time) at their first step and carry on."""

    def __init__(self, folder: Path, step: int, timeout_s: float = 300):
        self.folder, self.step, self.timeout_s = Path(folder), step, timeout_s

    def __call__(self, step: int, rank: int, resumed_from: int | None) -> None:
        if resumed_from is None and step == self.step:
            (self.folder / f"held-rank{rank}").write_text(ray.get_runtime_context().get_node_id())
            wait_for_file(self.folder / "never", self.timeout_s)
        marker = self.folder / f"resumed-rank{rank}"
        if resumed_from is not None and not marker.exists():
            marker.write_text(str(time.time()))
