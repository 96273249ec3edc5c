"""A bench's build driver, run as a process of its own: one ``build_index`` on the Ray cluster at ``RAY_ADDRESS``.

    RAY_ADDRESS=... python bench/build_driver.py '{"input": "s3://...", "output": "s3://...", "model": "..."}'

The argument holds ``IndexJobConfig`` fields as JSON. Prints one line ``RESULT {json}``: the run's summary, its
wall time per input document and this process's peak RSS (the driver's memory, without the bench's own).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULT = "RESULT "


def peak_rss_bytes() -> int:
    """This process's own peak RSS since it started (``VmHWM``). Not ``ru_maxrss``: Linux carries that over
    from the parent across fork and exec, so a child of a bench would report the bench's corpus too."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def driver_command(**config) -> list[str]:
    """The command line that runs one build with these ``IndexJobConfig`` fields."""
    return [sys.executable, __file__, json.dumps(config | {"show_progress": False})]


def parse_result(stdout: str) -> dict | None:
    """The figures a driver printed, or None when it died before printing them."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
    return json.loads(lines[-1][len(RESULT):]) if lines else None


def main() -> None:
    import ray

    from embedlib.index import IndexJobConfig, build_index

    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    started = time.perf_counter()
    summary = build_index(IndexJobConfig(**json.loads(sys.argv[1])))
    seconds = time.perf_counter() - started
    figures = {key: round(value, 1) if isinstance(value, float) else value
               for key, value in dataclasses.asdict(summary).items() if key not in ("url", "rejects_url")}
    print(RESULT + json.dumps(figures | {
        "seconds": round(seconds, 1), "us_per_doc": round(1e6 * seconds / max(summary.docs_in, 1), 1),
        "driver_peak_rss_bytes": peak_rss_bytes(),
    }), flush=True)


if __name__ == "__main__":
    main()
