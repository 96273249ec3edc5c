"""What a run publishes, and what it never does: no empty or shrunken version by accident, no deleted version a
reader may hold. (Lost staging parts on S3 and an unchanged rerun publishing nothing: ``test_index.py``.)"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import all_ids, cranfield_rows, index_config, write_jsonl

from embedlib.index import (
    InputError,
    ShardedIndex,
    ShrinkError,
    build_index,
)
from embedlib.index import manifest as manifests


@pytest.fixture(scope="module")
def published(ray_cluster, tmp_path_factory, tiny_models) -> tuple[Path, Path]:
    """An index of 40 Cranfield documents (one version) and its input, built once for this module."""
    root = tmp_path_factory.mktemp("published")
    corpus = write_jsonl(root / "corpus.jsonl", cranfield_rows(40))
    build_index(index_config(corpus, str(root / "index"), tiny_models["bert"]))
    return Path(corpus), root / "index"


@pytest.fixture
def index_copy(published, tmp_path) -> str:
    """A private copy of the module's index, for one test to change."""
    shutil.copytree(published[1], tmp_path / "index")
    return str(tmp_path / "index")


def versions(index: str) -> list[str]:
    return sorted(p.name for p in Path(index).glob("v0*"))


def test_a_run_whose_every_row_is_rejected_publishes_nothing(index_copy, tiny_models, tmp_path):
    index = index_copy
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"_id": f"d{i}", "text": None} for i in range(3)])
    with pytest.raises(InputError, match=r"no valid documents \(3 rows rejected.*nothing published"):
        build_index(index_config(bad, index, tiny_models["bert"]))
    assert ShardedIndex.open(index).manifest["version"] == 1 and len(ShardedIndex.open(index)) == 40


def test_a_version_that_drops_most_documents_needs_allow_shrink(index_copy, tiny_models, tmp_path):
    index = index_copy
    few = write_jsonl(tmp_path / "few.jsonl", cranfield_rows(40)[:5])
    with pytest.raises(ShrinkError, match="would hold 5 documents, the published version 1 holds 40.*--allow-shrink"):
        build_index(index_config(few, index, tiny_models["bert"]))
    assert ShardedIndex.open(index).manifest["version"] == 1
    summary = build_index(index_config(few, index, tiny_models["bert"], allow_shrink=True))
    assert (summary.version, summary.carried_over) == (2, 5) and sorted(all_ids(index)) == sorted(
        r["_id"] for r in cranfield_rows(5))
    assert versions(index) == ["v000001", "v000002"]  # refused before any shard was written


def fake_version(root: Path, number: int, published_hours_ago: float | None) -> None:
    """A version folder; published (with a manifest saying when) unless ``published_hours_ago`` is None."""
    folder = root / manifests.version_name(number)
    folder.mkdir(parents=True)
    (folder / "shard-00000.parquet").write_bytes(b"rows")
    if published_hours_ago is not None:
        created = datetime.now(UTC) - timedelta(hours=published_hours_ago)
        (folder / "manifest.json").write_text(json.dumps({"created_at": created.isoformat()}))


def test_retention_counts_published_versions_only(tmp_path):
    fake_version(tmp_path, 1, published_hours_ago=48)
    for crashed in (2, 3):
        fake_version(tmp_path, crashed, published_hours_ago=None)
    fake_version(tmp_path, 4, published_hours_ago=47)
    assert manifests.prune_versions(str(tmp_path), keep=2, grace_seconds=0) == [2, 3]
    assert versions(str(tmp_path)) == ["v000001", "v000004"]  # v1 was one of the two published versions


def test_retention_never_removes_a_version_within_the_grace_period(tmp_path):
    for number, hours in ((1, 30), (2, 2), (3, 1), (4, 0)):
        fake_version(tmp_path, number, published_hours_ago=hours)
    assert manifests.prune_versions(str(tmp_path), keep=1, grace_seconds=24 * 3600) == [1]
    assert versions(str(tmp_path)) == ["v000002", "v000003", "v000004"]
    assert manifests.prune_versions(str(tmp_path), keep=1, grace_seconds=0) == [2, 3]
