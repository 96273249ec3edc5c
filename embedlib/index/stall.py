"""A bounded wait on a Ray Data stream: a pipeline that stops making progress fails with one line.

Ray Data waits forever for a pool actor that cannot come back (no node with its resources) or for a batch
stuck in a hung process. ``rows_or_stall`` yields a dataset's rows and raises ``PipelineStalledError`` when
none arrives for ``timeout_s`` seconds.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import ray

from embedlib.errors import UserError

_END = object()


class PipelineStalledError(UserError, TimeoutError):
    """No batch of a build step finished within ``stall_timeout_s`` seconds."""


def rows_or_stall(dataset: ray.data.Dataset, timeout_s: float, step: str) -> Iterator[dict]:
    """``dataset``'s rows as they stream by; ``PipelineStalledError`` after ``timeout_s`` s without one."""
    rows: queue.Queue = queue.Queue(maxsize=1024)

    def pump() -> None:
        try:
            for row in dataset.iter_rows():
                rows.put(row)
            rows.put(_END)
        except BaseException as err:  # noqa: BLE001 - handed to the consuming thread, which raises it
            rows.put(err)

    threading.Thread(target=pump, name=f"embedlib-{step}", daemon=True).start()
    while True:
        try:
            item = rows.get(timeout=timeout_s)
        except queue.Empty:
            raise PipelineStalledError(
                f"{step}: no batch finished for {timeout_s:g} s (stall_timeout_s); the pipeline is stalled "
                "(a hung encoder, or no node left with the resources its actors need). Finished parts are "
                "kept: rerun the job once the cluster is healthy") from None
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item
