"""Read a corpus (jsonl or parquet, any fsspec URL) into a Ray dataset of checked rows.

Every input row comes out once, either valid (``reason == ""``) or with the reason it is rejected.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq
import ray
from pyarrow.fs import FSSpecHandler, PyFileSystem

from embedlib import storage
from embedlib.errors import UserError
from embedlib.index.config import IndexJobConfig

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
ROW_COLUMNS = ("id", "title", "text", "content_hash", "reason", "source", "line")
GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
READ_CPUS = 0.25  # reads wait on storage; a whole CPU each would starve the encoder actors on small nodes


class InputError(UserError, ValueError):
    """An input that cannot be indexed at all (missing, unreadable, empty); the message names the URL."""


def content_hash(title: str, text: str) -> str:
    """Identity of a document's content: what decides whether it must be re-embedded."""
    return hashlib.sha256(f"{title}\x1f{text}".encode()).hexdigest()[:32]


def input_format(cfg: IndexJobConfig, files: list[str]) -> str:
    if cfg.input_format != "auto":
        return cfg.input_format
    if all(f.endswith(PARQUET_SUFFIXES) for f in files):
        return "parquet"
    if all(f.endswith(JSONL_SUFFIXES) for f in files):
        return "jsonl"
    names = [f.rsplit("/", 1)[-1] for f in files[:3]]
    raise InputError(
        f"{storage.redact_url(cfg.input)}: cannot tell the format of {names}; set input_format to jsonl or parquet"
    )


def list_input_files(url: str, fmt: str = "auto") -> list[str]:
    """The data files at ``url``, sorted: one file; a BEIR dataset folder's ``corpus.*`` alone (never its
    queries); or every jsonl/parquet file under a folder."""
    where = storage.redact_url(url)
    try:
        fs, path = storage.filesystem(url)
        if fs.isfile(path):
            return [path]
        if not fs.isdir(path):
            raise InputError(f"{where}: no such file or folder")
        suffixes = {"jsonl": JSONL_SUFFIXES, "parquet": PARQUET_SUFFIXES}.get(
            fmt, JSONL_SUFFIXES + PARQUET_SUFFIXES
        )
        files = sorted(f for f in fs.find(path) if f.endswith(suffixes))
        corpus = [f for f in files if f.rsplit("/", 1)[-1].split(".", 1)[0] == "corpus"
                  and f.rsplit("/", 1)[0] == path.rstrip("/")]
        files = corpus or files
    except InputError:
        raise
    except Exception as err:  # noqa: BLE001 - any filesystem failure is reported with the URL
        raise InputError(f"{where}: cannot list input ({storage.error_text(err, url)})"
                         ) from None  # the cause may quote the URL's credentials
    if not files:
        raise InputError(f"{where}: no {fmt if fmt != 'auto' else 'jsonl or parquet'} files found")
    return files


def check_text_column(cfg: IndexJobConfig, files: list[str], fmt: str) -> None:
    """Fail before any encoding when the first file has no ``text_column`` (naming the columns it has)."""
    fs, _ = storage.filesystem(cfg.input)
    name = files[0].rsplit("/", 1)[-1]
    if fmt == "parquet":
        try:
            with fs.open(files[0], "rb") as f:
                columns = pq.ParquetFile(f).schema_arrow.names
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise InputError(f"{storage.redact_url(cfg.input)}: {name} is not a readable parquet file ({err})") from err
    else:
        first = first_jsonl_line(fs, files[0])
        if first.startswith("PAR1"):
            raise InputError(f"{storage.redact_url(cfg.input)}: {name} is a parquet file; name it .parquet or "
                             "set input_format: parquet")
        if first.lstrip().startswith("["):
            raise InputError(f"{storage.redact_url(cfg.input)}: {name} is a JSON array, not JSON lines "
                             "(one object per line)")
        row = try_json(first) or {}
        if not row:
            return  # an unreadable first line is that row's reject, not the whole input's
        columns = list(row)
    if cfg.text_column not in columns:
        raise InputError(f"{storage.redact_url(cfg.input)}: no column {cfg.text_column!r} in {name} (columns: "
                         f"{', '.join(map(str, columns[:20]))}); name the text column with --text-column")


def first_jsonl_line(fs, path: str) -> str:
    """The first non-blank line of a (possibly gzip-compressed) jsonl file, or "" when unreadable."""
    with fs.open(path, "rb") as f:
        head = f.read(1 << 20)
    try:
        if head.startswith(GZIP_MAGIC):
            head = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(head)
    except zlib.error:
        return ""
    head = head.removeprefix(UTF8_BOM)
    return next((line for line in head.split(b"\n") if line.strip()), b"").decode("utf-8", errors="replace")


def ray_filesystem(url: str):
    """What Ray's readers/writers take as ``filesystem``: None for local paths, else fsspec wrapped for pyarrow."""
    if storage.is_local(url):
        return None
    fs, _ = storage.filesystem(url)
    return PyFileSystem(FSSpecHandler(fs))


def check_row(raw_id, title, text, max_chars: int) -> tuple[str, str, str, str]:
    """``(id, title, text, reason)`` for one row; ``reason`` is empty when the row is valid."""
    if isinstance(raw_id, (int, np.integer)) and not isinstance(raw_id, (bool, np.bool_)):
        raw_id = str(raw_id)
    if raw_id is not None and not isinstance(raw_id, str):
        return "", "", "", f"id is {type(raw_id).__name__}, not a string or integer"
    doc_id = raw_id or ""
    if not doc_id:
        return "", "", "", "missing id"
    if not is_encodable(doc_id):
        return "", "", "", "id is not valid unicode (lone surrogate)"
    if text is None:
        return doc_id, "", "", "null text"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return doc_id, "", "", "undecodable bytes"
    if not isinstance(text, str):
        return doc_id, "", "", "non-string text"
    if len(text) > max_chars:
        return doc_id, "", "", f"text over {max_chars} chars"
    title = title if isinstance(title, str) else ""
    if not (is_encodable(text) and is_encodable(title)):
        return doc_id, "", "", "text is not valid unicode (lone surrogate)"
    return doc_id, title, text, ""


def is_encodable(value: str) -> bool:
    """False for strings UTF-8 cannot hold (lone surrogates, which JSON's ``\\ud800`` escapes can make)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def rows_table(records: list[tuple], max_chars: int) -> dict[str, np.ndarray]:
    """Checked rows from ``(raw_id, title, text, source, line, reason_or_None)`` records."""
    out = {name: [] for name in ROW_COLUMNS}
    for raw_id, title, text, source, line, early_reason in records:
        if early_reason:
            doc_id, title, text, reason = (raw_id if isinstance(raw_id, str) else ""), "", "", early_reason
        else:
            doc_id, title, text, reason = check_row(raw_id, title, text, max_chars)
        out["id"].append(doc_id)
        out["title"].append(title)
        out["text"].append(text)
        out["content_hash"].append(content_hash(title, text) if not reason else "")
        out["reason"].append(reason)
        out["source"].append(source)
        out["line"].append(line)
    return {k: np.array(v, dtype=np.int64 if k == "line" else object) for k, v in out.items()}


@dataclass(frozen=True)
class RowFormat:
    """How the input's rows are read: the id, text and title columns, the longest text, rows per block."""

    id_column: str
    text_column: str
    title_column: str | None
    max_chars: int
    batch_rows: int


def parse_jsonl_files(batch: dict[str, np.ndarray], rows: RowFormat):
    """jsonl files' bytes -> checked rows (one per non-blank line; see ``jsonl_bytes``), ``batch_rows`` at a
    time: a large file becomes many blocks, which the encoder actors share."""
    for data, path in zip(batch["bytes"], batch["path"], strict=True):
        try:
            data = jsonl_bytes(bytes(data))
        except (OSError, EOFError) as err:  # a corrupt gzip file: one reject for the whole file
            yield rows_table([(None, None, None, path, 0, f"unreadable gzip ({err})")], rows.max_chars)
            continue
        records = []
        for number, line in enumerate(data.split(b"\n"), start=1):
            if line.strip():
                records.append(jsonl_record(line, path, number, rows))
            if len(records) == rows.batch_rows:
                yield rows_table(records, rows.max_chars)
                records = []
        if records:
            yield rows_table(records, rows.max_chars)


def jsonl_record(line: bytes, path: str, number: int, rows: RowFormat) -> tuple:
    """``(raw_id, title, text, source, line, reason_or_None)`` for one jsonl line."""
    id_column, text_column, title_column = rows.id_column, rows.text_column, rows.title_column
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError:
        row = try_json(line.decode("utf-8", errors="replace")) or {}
        raw_id = row.get(id_column)
        return raw_id if isinstance(raw_id, str) else None, None, None, path, number, "undecodable bytes"
    row = try_json(decoded)
    if row is None:
        return None, None, None, path, number, "invalid json"
    title = row.get(title_column) if title_column else None
    return row.get(id_column), title, row.get(text_column), path, number, None


def jsonl_bytes(data: bytes) -> bytes:
    """A jsonl file's text as UTF-8 bytes: gzip-compressed files (whatever their name) are decompressed and a
    leading UTF-8 byte-order mark is dropped."""
    if data.startswith(GZIP_MAGIC):
        data = gzip.decompress(data)
    return data.removeprefix(UTF8_BOM)


def try_json(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def parse_parquet_files(batch: dict[str, np.ndarray], rows: RowFormat, filesystem_url: str):
    """Parquet files -> checked rows, streamed a record batch at a time (``line``: the row number, from 1)."""
    id_column, text_column, title_column = rows.id_column, rows.text_column, rows.title_column
    fs, _ = storage.filesystem(filesystem_url)
    for path in batch["path"]:
        with fs.open(path, "rb") as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            wanted = [c for c in (id_column, text_column, title_column) if c and c in names]
            first = 1
            for part in parquet.iter_batches(batch_size=rows.batch_rows, columns=wanted):
                n = part.num_rows
                ids = part.column(id_column).to_pylist() if id_column in names else [None] * n
                texts = part.column(text_column).to_pylist() if text_column in names else [None] * n
                titles = part.column(title_column).to_pylist() if title_column in wanted else [None] * n
                records = [(i, ti, te, path, first + row, None)
                           for row, (i, ti, te) in enumerate(zip(ids, titles, texts, strict=True))]
                first += n
                yield rows_table(records, rows.max_chars)


def input_snapshot(url: str, files: list[str]) -> dict:
    """What the input was when read: each file's size and etag/mtime, and one hash over them (no URL: the
    caller records it redacted)."""
    fs, _ = storage.filesystem(url)
    entries = []
    for path in files:
        info = fs.info(path)
        stamp = info.get("ETag") or info.get("mtime") or info.get("LastModified") or ""
        entries.append({"path": path, "size": int(info.get("size") or 0), "stamp": str(stamp).strip('"')})
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()
    return {"files": entries, "sha256": digest}


def read_rows(cfg: IndexJobConfig, files: list[str]) -> ray.data.Dataset:
    """A Ray dataset of the checked rows (``ROW_COLUMNS``) of ``files``, the input's files as the plan listed
    (and snapshotted) them."""
    fmt = input_format(cfg, files)
    default_id = "_id" if fmt == "jsonl" else "id"
    rows = RowFormat(cfg.id_column or default_id, cfg.text_column, cfg.title_column, cfg.max_text_chars,
                     cfg.batch_rows)
    try:
        if fmt == "jsonl":  # one task reads one file's bytes; the parse below cuts them into rows
            files_ds = ray.data.read_binary_files(files, include_paths=True, filesystem=ray_filesystem(cfg.input),
                                                  num_cpus=READ_CPUS)
            parse, parse_kwargs = parse_jsonl_files, dict(rows=rows)
        else:  # one task reads one parquet file, by its path
            files_ds = ray.data.from_items([{"path": f} for f in files], override_num_blocks=len(files))
            parse, parse_kwargs = parse_parquet_files, dict(rows=rows, filesystem_url=cfg.input)
        ds = files_ds.map_batches(
            parse,
            batch_size=1,
            batch_format="numpy",
            num_cpus=READ_CPUS,
            max_retries=cfg.max_task_retries,  # a read lost with its node is redone
            fn_kwargs=parse_kwargs,
        )
    except Exception as err:  # noqa: BLE001 - reader set-up failures are reported with the URL
        raise InputError(f"{storage.redact_url(cfg.input)}: cannot read input "
                         f"({storage.error_text(err, cfg.input)})") from None
    # Ray Data merges a task's output batches into blocks of up to 128 MiB, and one block goes to one encoder
    # actor: cut them back to ``batch_rows`` rows (streaming, no shuffle) so that every actor gets work.
    return ds.repartition(target_num_rows_per_block=cfg.batch_rows)
