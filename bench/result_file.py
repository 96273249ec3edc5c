"""The one writer of bench result files: ``bench/results/<name>.json`` with what is needed to reproduce them.

Every result carries the command line, the git commit (and whether the tree had uncommitted changes), the
machine (CPU model, cores, memory, GPU if any), the library versions, the wall time and the figures.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's embedlib, whichever folder the bench runs from

from embedlib.provenance import git_commit  # noqa: E402

RESULTS = ROOT / "bench" / "results"
LIBRARIES = ("torch", "transformers", "ray", "faiss-cpu", "pyarrow", "polars", "deepspeed")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no GPU stack at all
        return None


def machine() -> dict:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_bytes": memory, "gpu": gpu_name(),
            "python": platform.python_version(), "platform": platform.platform()}


def versions() -> dict:
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


class Result:
    """Start the clock at creation; ``write(figures)`` saves the result file and returns its path."""

    def __init__(self, name: str, argv: list[str] | None = None):
        self.name = name
        self.argv = argv if argv is not None else sys.argv
        self.started = time.perf_counter()
        self.started_at = datetime.now(UTC).isoformat()
        self.git = git_commit(ROOT)  # the code that ran: taken at the start, not when the result is written

    def write(self, figures: dict, folder: Path = RESULTS, top_level: dict | None = None) -> Path:
        """``top_level``: keys a result's schema puts beside ``figures`` (e.g. the quality table's ``sets``)."""
        folder.mkdir(parents=True, exist_ok=True)
        document = {
            "name": self.name,
            "command": " ".join(["python", *self.argv]),
            **self.git,
            "machine": machine(),
            "versions": versions(),
            "started_at": self.started_at,
            "wall_seconds": round(time.perf_counter() - self.started, 1),
            **(top_level or {}),
            "figures": figures,
        }
        path = folder / f"{self.name}.json"
        path.write_text(json.dumps(document, indent=2, default=str) + "\n")
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        return path


def add_result_argument(parser, default: str) -> None:
    """``--result NAME``: the result file ``bench/results/NAME.json`` (a variant of a bench gets its own name)."""
    parser.add_argument("--result", default=default, help=f"result name: bench/results/NAME.json (default {default})")


def parse_with_result(parser, default: str):
    """``--result NAME`` added, the command line parsed: ``(args, Result(NAME))``, the clock started."""
    add_result_argument(parser, default)
    args = parser.parse_args()
    return args, Result(args.result)
