"""Multi-source training data: pairs per source, held-out splits, hard negatives mined per source, and a
mixture sampled by source weight in same-source batches.

Sources (``SourceConfig.kind``):
- ``beir``: one pair per relevant qrels entry (graded qrels: ``min_relevance``);
- ``q2q``: duplicate questions (Quora); the held-out split is by duplicate group, so no evaluation query or
  any of its duplicates is trained on;
- ``spans``: self-supervised neighbouring spans of plain text (a short span -> the span that follows it).

A source with ``loss: anchor`` trains no contrastive term: its batches only hold the model to the starting model's
embeddings of their texts (replay of a domain that is not trained for, against forgetting).

Every row carries ``source`` (its source's name): the contrastive losses keep in-batch negatives within a
source, and the same held-out split functions give the evaluation / dev sets (``heldout_dataset``) and the guard
sets of domains never trained on (``unseen_dataset``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from embedlib import storage
from embedlib.eval.beir import BeirDataset, load_beir
from embedlib.training.config import SourceConfig
from embedlib.training.data import DataError, beir_pairs, mine_bm25_negatives

log = logging.getLogger(__name__)

QUERY_WORDS = 32  # spans: the query span
PASSAGE_WORDS = 96  # spans: the span that follows it (the positive)


@dataclass
class SourceData:
    name: str
    pairs: list[dict]  # {"query", "positive", "query_id", "doc_id"}
    pool: BeirDataset  # hard negatives are mined from its corpus; its qrels name what is never a negative


def unit_hash(key: str) -> float:
    """A deterministic number in [0, 1) from ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") / 2**64


def heldout_ids(ids: Sequence[str], fraction: float, seed: int = 0) -> set[str]:
    """The ids held out: those whose seeded hash falls below ``fraction`` (stable as the id list grows)."""
    return {i for i in ids if unit_hash(f"{seed}:{i}") < fraction}


def duplicate_groups(qrels: dict[str, dict[str, int]]) -> dict[str, str]:
    """Each question id of a Q2Q qrels -> its duplicate group's smallest id (union-find over the pairs)."""
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for qid, docs in qrels.items():
        for did in docs:
            a, b = root(qid), root(did)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {x: root(x) for x in list(parent)}


def heldout_queries(source: SourceConfig, dataset: BeirDataset) -> set[str]:
    """The source's held-out query ids (q2q: every question of a held-out duplicate group)."""
    if source.kind == "q2q":
        groups = duplicate_groups(dataset.qrels)
        held_groups = heldout_ids(sorted(set(groups.values())), source.holdout, source.seed)
        return {qid for qid in dataset.qrels if groups[qid] in held_groups}
    return heldout_ids(list(dataset.qrels), source.holdout, source.seed)


def restrict_qrels(dataset: BeirDataset, keep: set[str]) -> BeirDataset:
    return dataclasses.replace(dataset, qrels={q: d for q, d in dataset.qrels.items() if q in keep})


def heldout_dataset(source: SourceConfig, max_docs: int | None = None) -> BeirDataset:
    """The source's held-out split as a dataset: qrels of the held-out queries only, over the whole corpus or,
    with ``max_docs``, over a seeded sample of that many documents, judged ones first (a cheap dev set: scores
    compare models, they are not the full-corpus figures)."""
    if source.kind == "spans" or source.holdout <= 0:
        raise DataError(f"source {source.name!r}: no held-out split (holdout is {source.holdout})")
    dataset = load_beir(source.url, source.split)
    return sampled_corpus(restrict_qrels(dataset, heldout_queries(source, dataset)), max_docs, source.seed)


def unseen_dataset(source: SourceConfig, max_docs: int | None = None) -> BeirDataset:
    """A source of a domain the model never trained on, as a guard dev set: beir / q2q: the queries outside its
    held-out split (which may be an evaluation set, so it stays unseen); spans: its span pairs (``max_pairs``).
    ``max_docs`` as in ``heldout_dataset``."""
    if source.kind == "spans":
        return sampled_corpus(span_source(source).pool, max_docs, source.seed)
    dataset = load_beir(source.url, source.split)
    if source.holdout > 0:
        dataset = restrict_qrels(dataset, set(dataset.qrels) - heldout_queries(source, dataset))
    return sampled_corpus(dataset, max_docs, source.seed)


def sampled_corpus(dataset: BeirDataset, max_docs: int | None, seed: int) -> BeirDataset:
    """``dataset`` over a seeded sample of ``max_docs`` of its documents, the judged ones first (None: all)."""
    if max_docs is None or max_docs >= len(dataset.corpus):
        return dataset
    judged = {d for docs in dataset.qrels.values() for d in docs} & set(dataset.corpus)
    rng = random.Random(seed)
    ranked = rng.sample(sorted(judged), len(judged))
    ranked += rng.sample(sorted(set(dataset.corpus) - judged), len(dataset.corpus) - len(ranked))
    keep = set(ranked[:max_docs])
    return dataclasses.replace(dataset, corpus={d: text for d, text in dataset.corpus.items() if d in keep})


def capped(pairs: list[dict], source: SourceConfig) -> list[dict]:
    random.Random(source.seed).shuffle(pairs)
    return pairs[: source.max_pairs] if source.max_pairs else pairs


def beir_source(source: SourceConfig) -> SourceData:
    dataset = load_beir(source.url, source.split)
    held = heldout_queries(source, dataset)
    train = restrict_qrels(dataset, set(dataset.qrels) - held)
    return SourceData(source.name, capped(beir_pairs(train, source.min_relevance), source), dataset)


def q2q_source(source: SourceConfig) -> SourceData:
    """Duplicate pairs of the training groups; the pool's qrels add each question itself (never its own negative)."""
    data = beir_source(source)
    qrels = {qid: {**docs, qid: 1} for qid, docs in data.pool.qrels.items()}
    return dataclasses.replace(data, pool=dataclasses.replace(data.pool, qrels=qrels))


def text_files(url: str) -> list[str]:
    path = Path(storage.strip_file_scheme(url))
    files = sorted(str(p) for p in path.glob("*.txt")) if path.is_dir() else [str(path)]
    if not files:
        raise DataError(f"{url}: no .txt files")
    return files


def span_source(source: SourceConfig) -> SourceData:
    """Neighbouring spans: the first ``QUERY_WORDS`` words of a block -> the next ``PASSAGE_WORDS`` words.

    The pool is every passage span of the files; a query's own block is never its negative.
    """
    corpus: dict[str, dict[str, str]] = {}
    candidates = []
    for path in text_files(source.url):
        words = storage.read_bytes(path).decode("utf-8", errors="replace").split()
        stem = Path(path).stem
        block = QUERY_WORDS + PASSAGE_WORDS
        for start in range(0, len(words) - block + 1, block):
            query_id, doc_id = f"{stem}:{start}:q", f"{stem}:{start}"
            corpus[doc_id] = {"title": "", "text": " ".join(words[start + QUERY_WORDS : start + block])}
            candidates.append((query_id, " ".join(words[start : start + QUERY_WORDS]), doc_id))
    if not candidates:
        raise DataError(f"{source.url}: no text long enough for a {QUERY_WORDS}+{PASSAGE_WORDS}-word span pair")
    pairs = capped(
        [{"query": q, "positive": corpus[d]["text"], "query_id": qid, "doc_id": d} for qid, q, d in candidates],
        source,
    )
    queries = {p["query_id"]: p["query"] for p in pairs}
    qrels = {p["query_id"]: {p["doc_id"]: 1} for p in pairs}
    return SourceData(source.name, pairs, BeirDataset(corpus, queries, qrels, source.url))


SOURCE_READERS = {"beir": beir_source, "q2q": q2q_source, "spans": span_source}


def with_relevant_ids(data: SourceData) -> SourceData:
    """Each pair with ``relevant_ids``: every document judged relevant to its query (never its in-batch negative)."""
    qrels = data.pool.qrels
    pairs = [
        {**p, "relevant_ids": sorted(d for d, grade in qrels.get(p["query_id"], {}).items() if grade > 0)}
        for p in data.pairs
    ]
    return dataclasses.replace(data, pairs=pairs)


def read_source(source: SourceConfig) -> SourceData:
    data = with_relevant_ids(SOURCE_READERS[source.kind](source))
    if not data.pairs:
        raise DataError(f"source {source.name!r} ({source.url}): no training pairs")
    log.info("source %s: %d pairs", source.name, len(data.pairs))
    return data


def with_negatives(data: SourceData, k: int, skip_top: int = 0) -> list[dict]:
    """The source's pairs as triplets with ``k`` BM25 negatives mined from its own pool, after ``skip_top``."""
    depth = 30 if not skip_top else 100 + skip_top  # room for the skipped, and for many judged-relevant documents
    return mine_bm25_negatives(data.pairs, data.pool, k=k, skip_top=skip_top, depth=depth)


def rows_per_source(weights: Sequence[float], rows: int, block: int) -> list[int]:
    """``rows`` split by weight, each share a whole number of ``block``-row batches (at least one)."""
    total = sum(weights)
    blocks = max(len(weights), rows // block)
    shares = [max(1, round(blocks * w / total)) for w in weights]
    return [share * block for share in shares]


def sample_rows(rows: list[dict], count: int, rng: random.Random) -> list[dict]:
    """``count`` rows: whole shuffled passes over ``rows``, the last one cut short."""
    out: list[dict] = []
    while len(out) < count:
        order = rows[:]
        rng.shuffle(order)
        out.extend(order[: count - len(out)])
    return out


def mixture_rows(
    sources: Sequence[SourceConfig],
    per_source_rows: Sequence[list[dict]],
    rows: int | None,
    batch_size: int,
    same_source_batches: bool = True,
    seed: int = 0,
) -> list[dict]:
    """The mixture: rows sampled per source by weight, tagged with ``source``, in same-source batches; where a
    source is anchor-only (``loss: anchor``), every row is also tagged ``anchor_only``.

    ``rows`` ``None``: every source's rows once, whatever the weights.
    """
    rng = random.Random(seed)
    block = batch_size if same_source_batches else 1
    if rows is None:
        counts = [len(r) - len(r) % block or len(r) for r in per_source_rows]
    else:
        counts = rows_per_source([s.weight for s in sources], rows, block)
    batches: list[list[dict]] = []
    any_anchor_only = any(source.loss == "anchor" for source in sources)
    for source, source_rows, count in zip(sources, per_source_rows, counts, strict=True):
        tags = {"source": source.name} | ({"anchor_only": source.loss == "anchor"} if any_anchor_only else {})
        tagged = [{**row, **tags} for row in sample_rows(source_rows, count, rng)]
        batches.extend(tagged[i : i + block] for i in range(0, len(tagged), block))
    rng.shuffle(batches)
    return [row for batch in batches for row in batch]


def build_mixture(
    sources: Sequence[SourceConfig],
    rows: int | None,
    batch_size: int,
    hard_negatives: int = 0,
    same_source_batches: bool = True,
    seed: int = 0,
) -> list[dict]:
    """Read every source, mine ``hard_negatives`` per source (0: pair rows), and mix them.

    Anchor-only sources get empty negative lists: their batches train no contrastive term, so nothing is mined for
    them (and none of their pairs is dropped for want of negatives)."""
    per_source = []
    for source in sources:
        data = read_source(source)
        if hard_negatives and source.loss == "anchor":
            per_source.append([pair | {"negatives": [], "negative_ids": []} for pair in data.pairs])
        elif hard_negatives:
            per_source.append(with_negatives(data, hard_negatives, source.negatives_skip_top))
        else:
            per_source.append(data.pairs)
    mixed = mixture_rows(sources, per_source, rows, batch_size, same_source_batches, seed)
    counts = {s.name: sum(1 for r in mixed if r["source"] == s.name) for s in sources}
    log.info("mixture: %d rows %s", len(mixed), counts)
    return mixed
