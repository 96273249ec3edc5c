"""The indexing job's configuration (validated at the edge, errors name the field) and its summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from embedlib.config import ConfigError, from_dict
from embedlib.encoding.formats import QUANTIZATIONS
from embedlib.encoding.representative_defaults import DEFAULT_K_PASSAGE, DEFAULT_K_QUERY, DEFAULT_TOP_TERMS

INDEX_TYPES = ("flat", "ivf", "hnsw")
METHODS = ("dense", "diffretriever")
INPUT_FORMATS = ("auto", "jsonl", "parquet")
# How a run is carried out, not what it publishes (locations are recorded by the input snapshot and the
# model's weights hash instead): a rerun that differs only in these is the same index.
RUN_ONLY_FIELDS = ("input", "output", "model", "strict", "actors", "cpus_per_actor", "gpus_per_actor",
                   "torch_threads", "device", "dtype", "batch_rows", "max_tokens_per_batch", "keep_versions",
                   "keep_recent_hours", "allow_shrink", "show_progress", "lease_seconds", "lease_wait_seconds",
                   "max_actor_restarts", "max_task_retries", "stall_timeout_s")


@dataclass
class IndexJobConfig:
    """Everything one indexing run needs; ``validate()`` is called by ``build_index``."""

    input: str
    output: str
    model: str | None = None  # None: the embedded default model (all-MiniLM-L6-v2)
    # "dense": one pooled vector per document (or chunk); "diffretriever": a diffusion LM's K_p mask-token
    # vectors (multi-vector, MaxSim) and a sparse term vector per document, from one forward pass.
    method: str = "dense"
    k_passage: int = DEFAULT_K_PASSAGE  # diffretriever: mask tokens (vectors) per document
    k_query: int = DEFAULT_K_QUERY  # diffretriever: mask tokens per query (recorded for searchers; overridable)
    top_terms: int = DEFAULT_TOP_TERMS  # diffretriever: terms kept per sparse vector
    quantization: str = "int8"
    dim: int | None = None  # Matryoshka truncation
    index_type: str = "flat"
    shard_size: int = 100_000  # documents per shard
    input_format: str = "auto"  # by file extension when "auto"
    id_column: str | None = None  # None: "_id" for jsonl (BEIR layout), "id" for parquet
    text_column: str = "text"
    title_column: str | None = "title"  # None or a missing column: no title
    chunk_tokens: int | None = None  # late chunking: pool each span of this many tokens
    strict: bool = False  # any rejected row fails the job
    max_text_chars: int = 1_000_000  # longer texts are rejected
    # Encoding stage (Ray Data actor pool).
    actors: int = 1
    cpus_per_actor: float = 0.5
    gpus_per_actor: float = 0.0
    actor_resources: dict | None = None  # custom Ray resources each encoder actor needs (to pin it to a node type)
    torch_threads: int | None = None  # None: all cores of the node divided by ``actors``
    device: str | None = None
    dtype: str | None = None
    batch_rows: int = 1024  # rows per Ray Data batch handed to an encoder actor
    max_tokens_per_batch: int = 16_384
    # Fault tolerance (set explicitly, not Ray's defaults: Ray Data restarts pool actors forever).
    max_actor_restarts: int = 4  # an encoder actor lost with its node or process is restarted this often
    max_task_retries: int = 4  # a batch (or read task) lost with its actor or node is retried this often
    stall_timeout_s: float = 600.0  # no encoder batch or shard finished for this long: fail (PipelineStalledError)
    # FAISS parameters (defaults scale with the corpus size when None).
    nlist: int | None = None
    nprobe: int = 32
    hnsw_m: int = 32
    ef_search: int = 128
    pq_m: int | None = None
    train_sample: int = 200_000
    rerank_factor: int = 4  # IVF/HNSW: candidates per shard = k * rerank_factor, re-scored exactly
    keep_versions: int = 3  # published versions kept (the current one included); unpublished ones never count
    keep_recent_hours: float = 24.0  # a version published less than this long ago is never deleted
    allow_shrink: bool = False  # publish a version with under half the current version's documents
    # One build at a time per output (``embedlib.index.lease``): the lease lasts this long unless renewed (the
    # build renews it every third of it), and a build finding it held waits this long before failing.
    lease_seconds: float = 60.0
    lease_wait_seconds: float = 0.0
    show_progress: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> IndexJobConfig:
        """Build from plain data (e.g. parsed YAML): unknown, missing or mistyped fields are ``ConfigError``s."""
        return from_dict(cls, values).validate()

    def index_settings(self) -> dict[str, Any]:
        """The fields that shape the published index (everything but ``RUN_ONLY_FIELDS``)."""
        return {name: value for name, value in asdict(self).items() if name not in RUN_ONLY_FIELDS}

    def validate(self) -> IndexJobConfig:
        """Check every field; raises ``ConfigError`` naming the first bad one. Returns self."""
        for name in ("input", "output"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name}: a non-empty path or URL is required")
        if self.method not in METHODS:
            raise ConfigError(f"method: must be one of {METHODS}, got {self.method!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization: must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.index_type not in INDEX_TYPES:
            raise ConfigError(f"index_type: must be one of {INDEX_TYPES}, got {self.index_type!r}")
        if self.input_format not in INPUT_FORMATS:
            raise ConfigError(f"input_format: must be one of {INPUT_FORMATS}, got {self.input_format!r}")
        positive = (
            "shard_size",
            "max_text_chars",
            "actors",
            "batch_rows",
            "max_tokens_per_batch",
            "nprobe",
            "hnsw_m",
            "ef_search",
            "train_sample",
            "rerank_factor",
            "keep_versions",
            "k_passage",
            "k_query",
            "top_terms",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
        for name in ("dim", "chunk_tokens", "nlist", "pq_m", "torch_threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name}: must be a positive integer or null, got {value!r}")
        if self.quantization == "binary" and self.dim is not None and self.dim % 8:
            raise ConfigError(f"dim: binary codes need a multiple of 8, got {self.dim}")
        if self.method == "diffretriever":
            for name, default in (("quantization", "int8"), ("index_type", "flat")):
                if getattr(self, name) != default:
                    raise ConfigError(f"{name}: not used by method diffretriever (multi-vector float + sparse)")
            for name in ("dim", "chunk_tokens"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name}: not supported with method diffretriever")
        if not isinstance(self.keep_recent_hours, int | float) or self.keep_recent_hours < 0:
            raise ConfigError(f"keep_recent_hours: must be a number >= 0, got {self.keep_recent_hours!r}")
        for name, least in (("lease_seconds", 1), ("lease_wait_seconds", 0)):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{name}: must be a number >= {least}, got {value!r}")
        for name in ("max_actor_restarts", "max_task_retries"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name}: must be an integer >= 0, got {value!r}")
        if not isinstance(self.stall_timeout_s, int | float) or isinstance(self.stall_timeout_s, bool) \
                or self.stall_timeout_s <= 0:
            raise ConfigError(f"stall_timeout_s: must be a number of seconds > 0, got {self.stall_timeout_s!r}")
        if self.actor_resources is not None and not all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                for k, v in self.actor_resources.items()):
            raise ConfigError(f"actor_resources: must map resource names to amounts > 0, got {self.actor_resources!r}")
        if self.cpus_per_actor < 0 or self.gpus_per_actor < 0:
            raise ConfigError("cpus_per_actor/gpus_per_actor: must be >= 0")
        if not self.text_column:
            raise ConfigError("text_column: must be a column name")
        return self


@dataclass
class IndexSummary:
    """What one run did; ``str()`` is the one-paragraph summary the job prints."""

    url: str
    version: int
    docs_in: int
    embedded: int  # documents encoded in this run
    carried_over: int  # documents whose vectors came from an earlier version or an interrupted run
    rejected: int
    rejects_by_reason: dict[str, int]
    rejects_url: str | None
    shards: int
    rows: int  # index rows (documents, or chunks with --chunk-tokens)
    bytes_per_doc: float
    seconds: float
    encode_seconds: float
    truncated: int = 0
    # Documents encoded more than once: their batch was retried after its actor or node was lost, or a killed
    # run had encoded them without writing its part. Each is in the index once.
    redone: int = 0
    published: bool = True  # False: the published version already indexes this input in this way

    @property
    def docs_per_second(self) -> float:
        return (self.docs_in - self.rejected) / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        if not self.published:
            return (f"index {self.url}: unchanged, version {self.version} already indexes this input (same files, "
                    f"model and settings); nothing published ({self.seconds:.1f} s)")
        reasons = ", ".join(f"{r}: {n}" for r, n in sorted(self.rejects_by_reason.items())) or "none"
        return (
            f"index {self.url} version {self.version}: {self.docs_in} docs in, {self.embedded} embedded, "
            f"{self.carried_over} carried over, {self.rejected} rejected ({reasons}), {self.shards} shards, "
            f"{self.rows} rows, {self.bytes_per_doc:.1f} bytes/doc, {self.docs_per_second:.1f} docs/s "
            f"({self.seconds:.1f} s), {self.truncated} texts truncated to the model's max length, "
            f"{self.redone} docs encoded again after a lost actor, node or run"
        )
