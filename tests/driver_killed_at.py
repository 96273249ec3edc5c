"""Test helper: run ``jobs/index.py`` and SIGKILL this driver at a point of the build, as a lost driver node would.

    python tests/driver_killed_at.py encode:0.3 DOCS -- <jobs/index.py arguments>   # once 30% of DOCS are encoded
    python tests/driver_killed_at.py publish 0 -- <jobs/index.py arguments>         # shards and the version's
                                                                                     # manifest written, the root not

The points are events of the build seen from its driver (counts of finished parts, the root manifest's write),
so the kill lands in the same phase on every run. The hooks live only in this script's process.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import embedlib.index.build as build  # noqa: E402
from embedlib import storage  # noqa: E402
from embedlib.index import manifest as manifests  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_when_encoded(docs: int) -> None:
    """Die once the encode step's finished parts hold ``docs`` documents."""
    stream = build.rows_or_stall

    def counted(dataset, timeout_s, step):
        seen = 0
        for row in stream(dataset, timeout_s, step):
            seen += json.loads(row["counts"]).get("docs", 0)
            if step == "encode" and seen >= docs:
                die()
            yield row

    build.rows_or_stall = counted


def kill_before_root_manifest() -> None:
    """Die when the root manifest is about to be written (the version's own manifest is written first)."""
    write = storage.write_bytes_atomic

    def write_or_die(url, data):
        if str(url).endswith(f"/{manifests.MANIFEST}") and not manifests.VERSION_DIR.match(
                str(url).rsplit("/", 2)[-2]):
            die()
        write(url, data)

    storage.write_bytes_atomic = write_or_die


def main() -> None:
    point, docs, separator, *job_args = sys.argv[1:]
    assert separator == "--", __doc__
    if point == "publish":
        kill_before_root_manifest()
    else:
        kill_when_encoded(int(float(point.split(":")[1]) * int(docs)))
    sys.argv = [str(ROOT / "jobs" / "index.py"), *job_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
