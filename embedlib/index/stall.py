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
from ray.data.block import BlockAccessor

from embedlib.errors import UserError

_END = object()


class PipelineStalledError(UserError, TimeoutError):
    """No batch of a build step finished within ``stall_timeout_s`` seconds."""


def rows_or_stall(dataset: ray.data.Dataset, timeout_s: float, step: str) -> Iterator[dict]:
    """``dataset``'s rows as they stream by; ``PipelineStalledError`` after ``timeout_s`` s without one.

    The blocks are fetched by a helper thread, so that the wait for the next one can be bounded; on a stall
    (or any early exit) the dataset's executor is shut down, so nothing of the run keeps running behind it. Ray
    Data hands the executor out only with the first output: after a stall before it, the helper thread waits
    for that output and then shuts the run down.
    """
    blocks: queue.Queue = queue.Queue(maxsize=64)
    executors: list = []
    stopped = threading.Event()

    def hand_over(item) -> bool:
        """Queue ``item`` for the consumer; False once it stopped listening."""
        while not stopped.is_set():
            try:
                blocks.put(item, timeout=1.0)
                return True
            except queue.Full:
                continue
        return False

    def stop_run() -> None:
        for executor in executors:
            if executor is not None:  # None: Ray Data served the dataset from its cache
                executor.shutdown(force=True)

    def pump() -> None:
        try:
            # Ray Data hands the executor out only with its bundle iterator (no public way to stop a stream),
            # and only once the first output is there: so this waits in the helper thread too.
            bundles, _, executor = dataset.iterator()._to_ref_bundle_iterator()
            executors.append(executor)
            for bundle in bundles:
                for ref in bundle.block_refs:
                    if not hand_over(ray.get(ref)):  # the consumer stopped listening
                        stop_run()
                        return
            hand_over(_END)
        except BaseException as err:  # noqa: BLE001 - handed to the consuming thread, which raises it
            hand_over(err)

    threading.Thread(target=pump, name=f"embedlib-{step}", daemon=True).start()
    finished = False
    try:
        while True:
            try:
                item = blocks.get(timeout=timeout_s)
            except queue.Empty:
                raise PipelineStalledError(
                    f"{step}: no batch finished for {timeout_s:g} s (stall_timeout_s); the pipeline is stalled "
                    "(a hung encoder, or no node left with the resources its actors need). Finished parts are "
                    "kept: rerun the job once the cluster is healthy") from None
            if item is _END:
                finished = True
                return
            if isinstance(item, BaseException):
                raise item
            yield from BlockAccessor.for_block(item).to_arrow().to_pylist()
    finally:
        stopped.set()
        if not finished:
            stop_run()
