"""Indexing: Ray Data encodes a corpus into sharded parquet + FAISS indexes; ``ShardedIndex`` searches them."""

from embedlib.index.build import RejectedRowsError, build_index
from embedlib.index.config import ConfigError, IndexJobConfig, IndexSummary
from embedlib.index.manifest import ManifestError
from embedlib.index.reading import InputError
from embedlib.index.sharded import IndexMismatchError, ShardedIndex

__all__ = [
    "ConfigError",
    "IndexJobConfig",
    "IndexMismatchError",
    "IndexSummary",
    "InputError",
    "ManifestError",
    "RejectedRowsError",
    "ShardedIndex",
    "build_index",
]
