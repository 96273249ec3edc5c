"""BEIR-layout datasets (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) from any fsspec URL."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

from embedlib import storage
from embedlib.encoding.formats import embedded_text
from embedlib.errors import UserError


class DatasetError(UserError, ValueError):
    """A dataset that cannot be evaluated; the message names the file and the offending ids."""


@dataclass
class BeirDataset:
    corpus: dict[str, dict[str, str]]  # id -> {"title", "text"}
    queries: dict[str, str]  # id -> text
    qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}
    source: str

    def doc_ids(self) -> list[str]:
        return list(self.corpus)

    def doc_texts(self, with_title: bool = True) -> list[str]:
        """Document texts as BEIR/sentence-transformers embed them: ``title + " " + text``."""
        return [
            embedded_text(doc.get("title") if with_title else None, doc["text"])
            for doc in self.corpus.values()
        ]

    def judged_queries(self) -> dict[str, str]:
        """The queries that have at least one qrels row, in file order."""
        return {qid: text for qid, text in self.queries.items() if qid in self.qrels}


def read_jsonl(url: str) -> list[dict]:
    text = storage.read_bytes(url).decode("utf-8")
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DatasetError(f"{url}:{number}: not valid JSON ({err.msg})") from err
    return rows


def read_qrels(url: str) -> dict[str, dict[str, int]]:
    text = storage.read_bytes(url).decode("utf-8")
    qrels: dict[str, dict[str, int]] = {}
    reader = csv.reader(io.StringIO(text), delimiter="\t")
    header = next(reader, None)
    if header is None:
        raise DatasetError(f"{url}: empty qrels file")
    for row in reader:
        if len(row) < 3:
            continue
        qrels.setdefault(row[0], {})[row[1]] = int(float(row[2]))
    return qrels


def read_parquet_rows(url: str) -> list[dict]:
    import pyarrow.parquet as pq

    fs, path = storage.filesystem(url)
    return pq.read_table(path, filesystem=fs).to_pylist()


def read_qrels_parquet(url: str) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for row in read_parquet_rows(url):
        try:
            qrels.setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(float(row["score"]))
        except KeyError as err:
            raise DatasetError(f"{url}: qrels need columns query-id, corpus-id, score; missing {err}") from err
    return qrels


def dataset_file(url: str, name: str, parquet_name: str) -> str:
    """``name`` under ``url``, or its parquet equivalent; the error names the file looked for."""
    for candidate in (name, parquet_name):
        if storage.exists(storage.join(url, candidate)):
            return storage.join(url, candidate)
    raise DatasetError(f"{storage.join(url, name)}: file not found (nor {parquet_name})")


def read_records(url: str) -> list[dict]:
    """All rows of a small ``.parquet`` or jsonl file (a dataset's corpus and queries, training rows in tests)."""
    return read_parquet_rows(url) if url.endswith(".parquet") else read_jsonl(url)


def load_beir(url: str, split: str = "test") -> BeirDataset:
    """Load a BEIR-layout dataset (jsonl/tsv, or ``corpus.parquet``, ``queries.parquet``,
    ``qrels/<split>.parquet``); missing files and qrels naming unknown ids are errors that name them."""
    corpus_url = dataset_file(url, "corpus.jsonl", "corpus.parquet")
    queries_url = dataset_file(url, "queries.jsonl", "queries.parquet")
    qrels_url = dataset_file(url, f"qrels/{split}.tsv", f"qrels/{split}.parquet")
    corpus = {
        str(row["_id"]): {"title": row.get("title") or "", "text": row.get("text") or ""}
        for row in read_records(corpus_url)
    }
    queries = {str(row["_id"]): row["text"] for row in read_records(queries_url)}
    qrels = read_qrels_parquet(qrels_url) if qrels_url.endswith(".parquet") else read_qrels(qrels_url)
    unknown_queries = sorted(set(qrels) - set(queries))
    unknown_docs = sorted({d for docs in qrels.values() for d in docs} - set(corpus))
    if unknown_queries or unknown_docs:
        raise DatasetError(
            f"{qrels_url}: {len(unknown_queries)} unknown query ids {unknown_queries[:10]} and "
            f"{len(unknown_docs)} unknown corpus ids {unknown_docs[:10]}"
        )
    if not queries:
        raise DatasetError(f"{queries_url}: no queries")
    if not any(qid in qrels for qid in queries):
        raise DatasetError(f"{qrels_url}: no query in {queries_url} has a judgement")
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels, source=url)
