"""Indexing: Ray Data encodes a corpus into sharded parquet + FAISS indexes; ``ShardedIndex`` searches them.

The names below load on first use (``embedlib.index.X`` modules that Ray workers import stay torch-free).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedlib.index.build import RejectedRowsError, ShrinkError, StorageLostDataError, build_index
    from embedlib.index.config import ConfigError, IndexJobConfig, IndexSummary
    from embedlib.index.manifest import ManifestError
    from embedlib.index.reading import InputError
    from embedlib.index.sharded import IndexMismatchError, ShardedIndex

_EXPORTS = {
    "ConfigError": "embedlib.index.config",
    "IndexJobConfig": "embedlib.index.config",
    "IndexMismatchError": "embedlib.index.sharded",
    "IndexSummary": "embedlib.index.config",
    "InputError": "embedlib.index.reading",
    "ManifestError": "embedlib.index.manifest",
    "RejectedRowsError": "embedlib.index.build",
    "ShrinkError": "embedlib.index.build",
    "StorageLostDataError": "embedlib.index.build",
    "ShardedIndex": "embedlib.index.sharded",
    "build_index": "embedlib.index.build",
}
__all__ = [
    "ConfigError",
    "IndexJobConfig",
    "IndexMismatchError",
    "IndexSummary",
    "InputError",
    "ManifestError",
    "RejectedRowsError",
    "ShardedIndex",
    "ShrinkError",
    "StorageLostDataError",
    "build_index",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'embedlib.index' has no attribute {name!r}")
