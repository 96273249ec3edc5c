"""Distractor documents for large-corpus evaluation: paragraphs from plain-text corpora or a parquet corpus.

Paragraphs are blank-line-separated blocks, whitespace-normalised and cut into windows of at most
``max_words`` words; windows shorter than ``min_words`` are skipped. The order is deterministic (files in
sorted order), so the first ``n`` distractors of a larger run are exactly those of a smaller one.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from itertools import islice

import pyarrow.parquet as pq

from embedlib import storage
from embedlib.encoding.formats import embedded_text
from embedlib.eval.beir import DatasetError

TEXT_SUFFIXES = (".txt", ".tokens", ".zip")
DISTRACTOR_ID_PREFIX = "distractor-"
_BLANK_LINES = re.compile(r"\n\s*\n")


def paragraph_windows(text: str, max_words: int = 48, min_words: int = 8) -> Iterator[str]:
    """Whitespace-normalised windows of at most ``max_words`` words from each blank-line-separated block."""
    for block in _BLANK_LINES.split(text):
        words = block.split()
        for start in range(0, len(words), max_words):
            window = words[start : start + max_words]
            if len(window) >= min_words:
                yield " ".join(window)


def _texts_in_zip(data: bytes) -> Iterator[str]:
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in sorted(archive.namelist()):
            if name.endswith("/") or name.rsplit("/", 1)[-1].upper() == "README":
                continue
            yield archive.read(name).decode("utf-8", errors="replace")


def text_files(url: str) -> list[str]:
    """The plain-text files (``.txt``, ``.tokens``, ``.zip`` of texts) under ``url``, sorted; a file is itself."""
    fs, path = storage.filesystem(url)
    if fs.isfile(path):
        return [url]
    protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
    found = sorted(p for p in fs.find(path) if p.endswith(TEXT_SUFFIXES))
    if not found:
        raise DatasetError(f"{storage.redact_url(url)}: no {', '.join(TEXT_SUFFIXES)} files")
    return [protocol + p if protocol and not p.startswith(protocol) else p for p in found]


def parquet_texts(url: str, text_column: str = "text", title_column: str | None = "title") -> Iterator[str]:
    """``title + " " + text`` of every row of a parquet file or folder of parquet files, batch by batch."""
    fs, path = storage.filesystem(url)
    dataset = pq.ParquetDataset(path, filesystem=fs)
    names = dataset.schema.names
    if text_column not in names:
        raise ValueError(f"{url}: no column {text_column!r} (columns: {names})")
    columns = [text_column] + ([title_column] if title_column and title_column in names else [])
    for fragment in dataset.fragments:
        for batch in fragment.to_batches(columns=columns):
            texts = batch.column(text_column).to_pylist()
            titles = batch.column(title_column).to_pylist() if len(columns) > 1 else [None] * len(texts)
            for title, text in zip(titles, texts, strict=True):
                if text:
                    yield embedded_text(title, text)


def iter_distractors(url: str, max_words: int = 48, min_words: int = 8) -> Iterator[str]:
    """Distractor texts from ``url``: a parquet corpus (file or folder) or plain-text files, in a fixed order."""
    if url.rstrip("/").endswith(".parquet") or _is_parquet_folder(url):
        yield from parquet_texts(url)
        return
    for file in text_files(url):
        data = storage.read_bytes(file)
        texts = _texts_in_zip(data) if file.endswith(".zip") else [data.decode("utf-8", errors="replace")]
        for text in texts:
            yield from paragraph_windows(text, max_words, min_words)


def _is_parquet_folder(url: str) -> bool:
    fs, path = storage.filesystem(url)
    return fs.isdir(path) and any(p.endswith(".parquet") for p in fs.find(path))


def load_distractors(url: str, count: int, max_words: int = 48, min_words: int = 8) -> list[str]:
    """The first ``count`` distractors from ``url``; ``ValueError`` when the source holds fewer."""
    texts = list(islice(iter_distractors(url, max_words, min_words), count))
    if len(texts) < count:
        raise ValueError(f"{url}: holds {len(texts)} distractor paragraphs, {count} were asked for")
    return texts


def distractor_ids(count: int) -> list[str]:
    return [f"{DISTRACTOR_ID_PREFIX}{n}" for n in range(count)]
