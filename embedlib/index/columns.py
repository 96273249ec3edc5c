"""Arrow columns of stored vectors: fixed-size-list vectors and list-encoded sparse vectors, and back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import scipy.sparse as sp


def vector_type(width: int, dtype: np.dtype) -> pa.DataType:
    """How a row's vector is stored: its raw bytes, fixed size (parquet adds nothing per value)."""
    return pa.binary(width * np.dtype(dtype).itemsize)


def vectors_column(vectors: np.ndarray, type: pa.DataType | None = None) -> pa.Array:
    """A 2-D array as a column of fixed-size binary rows (``type``: ``vector_type``), or of fixed-size lists."""
    vectors = np.ascontiguousarray(vectors)
    if type is None or pa.types.is_fixed_size_list(type):
        array = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])
        return array.cast(type) if type is not None and array.type != type else array
    if vectors.shape[0] and vectors.shape[1] * vectors.itemsize != type.byte_width:
        raise ValueError(f"vectors of {vectors.shape[1]} x {vectors.dtype} do not fit {type}")
    return pa.FixedSizeBinaryArray.from_buffers(type, len(vectors), [None, pa.py_buffer(vectors.tobytes())])


def column_matrix(column: pa.ChunkedArray | pa.Array, dtype: np.dtype) -> np.ndarray:
    """The inverse of ``vectors_column`` (fixed-size binary or fixed-size list columns alike)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_fixed_size_binary(array.type):
        dtype = np.dtype(dtype)
        width = array.type.byte_width
        data = array.buffers()[1]
        raw = np.frombuffer(data, np.uint8, count=width * len(array), offset=width * array.offset)
        return raw.view(dtype).reshape(len(array), width // dtype.itemsize)
    width = array.type.list_size
    return np.asarray(array.flatten().to_numpy(zero_copy_only=False), dtype=dtype).reshape(-1, width)


def vector_bytes(column: pa.ChunkedArray | pa.Array) -> int:
    """Bytes per stored vector of a ``vectors_column`` column (from its type; -1 for any other column type)."""
    if pa.types.is_fixed_size_binary(column.type):
        return column.type.byte_width
    if pa.types.is_fixed_size_list(column.type) and pa.types.is_primitive(column.type.value_type):
        return column.type.list_size * column.type.value_type.bit_width // 8
    return -1


def sparse_columns(matrix: sp.csr_matrix) -> dict[str, pa.Array]:
    """A CSR matrix as ``sparse_ids`` / ``sparse_weights`` list columns (one row per matrix row)."""
    bounds = list(zip(matrix.indptr[:-1], matrix.indptr[1:], strict=True))
    return {
        "sparse_ids": pa.array([matrix.indices[a:b] for a, b in bounds], pa.list_(pa.int32())),
        "sparse_weights": pa.array([matrix.data[a:b] for a, b in bounds], pa.list_(pa.float32())),
    }


def sparse_matrix(
    ids: pa.ChunkedArray | pa.Array, weights: pa.ChunkedArray | pa.Array, vocab_size: int
) -> sp.csr_matrix:
    """The inverse of ``sparse_columns``."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    weights = weights.combine_chunks() if isinstance(weights, pa.ChunkedArray) else weights
    indptr = np.array(ids.offsets.to_numpy(), dtype=np.int64)
    indptr -= indptr[0]
    data = np.array(weights.flatten().to_numpy(zero_copy_only=False), np.float32)  # copies: arrow is read-only
    indices = np.array(ids.flatten().to_numpy(zero_copy_only=False), np.int32)
    return sp.csr_matrix((data, indices, indptr), shape=(len(ids), vocab_size))


HASH_TYPE = pa.binary(16)


def hash_bytes(hashes: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Hex content hashes (what reading computes) as 16 raw bytes each (what shards store)."""
    return pa.array([bytes.fromhex(h) for h in hashes.to_pylist()], HASH_TYPE)


def hash_hex(hashes: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The inverse of ``hash_bytes``."""
    return pa.array([h.hex() for h in hashes.to_pylist()], pa.string())
