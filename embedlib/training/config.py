"""Training configuration: one YAML file per run, validated here with errors that name the field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import yaml

from embedlib.config import ConfigError, from_dict, naming_file, read_yaml

Stage = Literal["pretrain", "pair", "contextual", "triplet", "diffretriever"]
STAGES: tuple[str, ...] = get_args(Stage)


SourceKind = Literal["beir", "q2q", "spans"]
SourceLoss = Literal["contrastive", "anchor"]


@dataclass
class SourceConfig:
    """One source of a multi-source mixture (``embedlib.training.mixture``)."""

    name: str
    kind: SourceKind  # beir: query -> relevant document; q2q: duplicate questions; spans: neighbouring text spans
    url: str  # beir / q2q: a BEIR-layout folder; spans: a .txt file or a folder of them
    split: str = "train"  # beir / q2q: the qrels split read
    weight: float = 1.0  # sampling weight: the source's share of the mixture's rows
    min_relevance: int = 1  # beir (graded qrels): positives are documents judged at least this
    # beir / q2q: fraction of queries (q2q: of duplicate groups) never trained on, the dev / evaluation split
    holdout: float = 0.0
    max_pairs: int | None = None  # cap on the source's distinct pairs (spans: how many to cut)
    # hard negatives start this far down the BM25 ranking of unjudged documents: for sources whose judgements are
    # incomplete (NFCorpus), the top of that ranking is mostly relevant documents nobody judged
    negatives_skip_top: int = 0
    seed: int = 0  # of the held-out split and the span sample
    # contrastive: the stage's loss (plus the anchor term); anchor: the anchor term alone, which holds the model to
    # the starting model's embeddings of the source's texts (replay of a domain not trained for, against forgetting)
    loss: SourceLoss = "contrastive"


@dataclass
class DataConfig:
    url: str  # parquet or jsonl file/folder at any fsspec URL; rows are read in order (converters shuffle)
    format: Literal["parquet", "jsonl"] | None = None  # None: from the URL's extension
    max_length: int = 256  # token cap per text (documents; queries use query_max_length)
    query_max_length: int = 64
    stream: bool = False  # True: Ray Data read tasks stream the files; False: read once into the object store
    # Multi-source mixture: ``jobs/train.py --prepare-mixture`` writes ``url`` from these sources.
    sources: list[SourceConfig] | None = None
    rows: int | None = None  # mixture rows, split over the sources by weight (a source smaller than its share repeats)
    same_source_batches: bool = True  # each batch of batch_size rows from one source (in-batch negatives stay in it)


@dataclass
class OptimizerConfig:
    lr: float = 2e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: Literal["cosine", "linear", "constant"] = "linear"
    grad_clip: float = 1.0


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 2
    precision: Literal["fp32", "bf16"] = "fp32"
    gradient_accumulation_steps: int = 1


@dataclass
class ScalingConfig:
    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    torch_threads: int | None = None  # CPU: threads per worker (None: Ray's OMP_NUM_THREADS)
    # How workers are placed: "STRICT_SPREAD" puts each on its own node, so losing a node loses one worker.
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_SPREAD"] = "PACK"


@dataclass
class LoraConfig:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"


@dataclass
class TrainConfig:
    stage: Stage
    model: str  # checkpoint folder (local path or URL) to start from
    output: str  # where the trained model is saved (Encoder.from_pretrained loads it)
    data: DataConfig
    batch_size: int = 32  # per worker, per micro-step
    max_steps: int | None = None  # optimizer steps; None: run epochs
    epochs: int = 1
    seed: int = 0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    lora: LoraConfig | None = None
    # Objective knobs; ``None`` means the published value of the stage.
    temperature: float | None = None
    false_negative_margin: float | None = 0.1
    matryoshka_dims: list[int] | None = None  # nested dims; the full width is always included
    # Weight of the sign straight-through (binary) InfoNCE term added to the INT8 one at every Matryoshka width.
    binary_weight: float = 0.0
    # Pair / triplet: documents sampled from the training rows whose mean embedding is saved with the model as its
    # binary centre (binary codes become ``sign(x - centre)``, queries of binary indexes float; 0: none).
    binary_centre_docs: int = 0
    # Pair / triplet: weight of a guard against forgetting, the mean ``1 - cos`` between each query's and positive's
    # pooled embedding and a frozen copy of the starting model's on the same text (0: off).
    anchor_weight: float = 0.0
    # Rows carrying ``source`` (a mixture): in-batch negatives only from the query's own source.
    same_source_negatives: bool = True
    contextual_alpha: float = 0.2
    contextual_beta: tuple[float, float] = (0.2, 0.5)
    max_chunks: int = 8  # contextual: chunks per document (more are dropped, with a warning)
    # Negatives per query. triplet: K >= 1 (null: 3, published). diffretriever: 0 = pair rows with in-batch
    # negatives, > 0 = triplet rows (null: 0).
    hard_negatives: int | None = None
    # diffretriever: mask tokens per query / passage, and the weight of the sparse InfoNCE term. Its
    # temperature (null: 0.05) applies to MaxSim / k_query, a cosine scale; the sparse term uses 1.
    k_query: int = 4
    k_passage: int = 16
    sparse_weight: float = 1.0
    mask_id: int | str | None = None  # pretrain: token id, "dream"/"llada", or None for the tokenizer's mask
    causal: bool = False  # ablation (b) only: causal attention, next-token pretraining, last-token pooling
    # Run management.
    run_name: str = "embedlib-train"
    checkpoint_url: str | None = None  # Ray Train storage (local or s3://); None: a folder beside output
    checkpoint_every: int = 50
    max_failures: int = 0
    log_every: int = 1  # a progress line from rank 0 every this many steps
    # Metrics to Ray Train between checkpoints every this many steps (0: with checkpoints only). Each report
    # waits until the controller has taken the previous one (it polls every 2 s): frequent reports throttle
    # fast steps.
    report_every: int = 0
    # "async": the step loop goes on while a checkpoint is uploaded (Ray Train uploads it in the background);
    # "sync": each checkpointing step waits for its upload.
    checkpoint_upload: Literal["sync", "async"] = "async"

    def __post_init__(self) -> None:
        if self.hard_negatives is None:
            self.hard_negatives = 0 if self.stage == "diffretriever" else 3
        validate(self)


def validate(cfg: TrainConfig) -> None:
    min_negatives = 0 if cfg.stage == "diffretriever" else 1
    checks = [
        ("batch_size", cfg.batch_size >= 1, "must be >= 1"),
        ("max_steps", cfg.max_steps is None or cfg.max_steps >= 1, "must be >= 1 or null"),
        ("epochs", cfg.epochs >= 1, "must be >= 1"),
        ("optimizer.lr", cfg.optimizer.lr > 0, "must be > 0"),
        ("deepspeed.zero_stage", cfg.deepspeed.zero_stage in (0, 1, 2, 3), "must be 0, 1, 2 or 3"),
        (
            "deepspeed.gradient_accumulation_steps",
            cfg.deepspeed.gradient_accumulation_steps >= 1,
            "must be >= 1",
        ),
        ("scaling.num_workers", cfg.scaling.num_workers >= 1, "must be >= 1"),
        ("scaling.cpus_per_worker", cfg.scaling.cpus_per_worker > 0, "must be > 0"),
        ("temperature", cfg.temperature is None or cfg.temperature > 0, "must be > 0"),
        ("contextual_alpha", 0 <= cfg.contextual_alpha <= 1, "must be in [0, 1]"),
        ("hard_negatives", cfg.hard_negatives >= min_negatives, f"must be >= {min_negatives}"),
        ("k_query", cfg.k_query >= 1, "must be >= 1"),
        ("k_passage", cfg.k_passage >= 1, "must be >= 1"),
        ("sparse_weight", cfg.sparse_weight >= 0, "must be >= 0"),
        ("checkpoint_every", cfg.checkpoint_every >= 1, "must be >= 1"),
        ("log_every", cfg.log_every >= 1, "must be >= 1"),
        ("report_every", cfg.report_every >= 0, "must be >= 0 (0: report with checkpoints only)"),
        ("matryoshka_dims", all(d > 0 for d in cfg.matryoshka_dims or []), "must be positive integers"),
        ("binary_weight", cfg.binary_weight >= 0, "must be >= 0"),
        ("binary_centre_docs", cfg.binary_centre_docs >= 0, "must be >= 0"),
        ("binary_centre_docs", not cfg.binary_centre_docs or cfg.stage in ("pair", "triplet"),
         f"is for the pair and triplet stages, not {cfg.stage!r}"),
        ("anchor_weight", cfg.anchor_weight >= 0, "must be >= 0"),
        ("anchor_weight", not cfg.anchor_weight or cfg.stage in ("pair", "triplet"),
         f"applies to the pair and triplet stages only, not {cfg.stage!r}"),
    ]
    for name, ok, message in checks:
        if not ok:
            raise ConfigError(f"{name}: {message}")
    validate_sources(cfg)
    if isinstance(cfg.mask_id, str) and cfg.mask_id not in ("dream", "llada"):
        raise ConfigError(
            f"mask_id: must be an integer token id, 'dream', 'llada' or null, got {cfg.mask_id!r}"
        )


def validate_sources(cfg: TrainConfig) -> None:
    """The mixture fields of ``data``: errors name the field (``data.sources[1].weight``)."""
    data = cfg.data
    if data.sources is None:
        return
    if not data.sources:
        raise ConfigError("data.sources: must list at least one source (or be null)")
    if data.rows is not None and data.rows < cfg.batch_size:
        raise ConfigError(f"data.rows: must be >= batch_size ({cfg.batch_size}), got {data.rows}")
    seen = set()
    for i, source in enumerate(data.sources):
        name = f"data.sources[{i}]"
        checks = [
            ("name", source.name not in seen, f"duplicate source name {source.name!r}"),
            ("weight", source.weight > 0, f"must be > 0, got {source.weight}"),
            ("holdout", 0 <= source.holdout < 1, f"must be in [0, 1), got {source.holdout}"),
            ("holdout", source.kind != "spans" or source.holdout == 0, "spans sources have no held-out split"),
            ("max_pairs", source.max_pairs is None or source.max_pairs >= 1, "must be >= 1 or null"),
            ("negatives_skip_top", source.negatives_skip_top >= 0, "must be >= 0"),
            ("min_relevance", source.min_relevance >= 1, "must be >= 1"),
            ("loss", source.loss != "anchor" or cfg.anchor_weight > 0,
             "an anchor-only source needs anchor_weight > 0"),
            ("loss", source.loss != "anchor" or data.same_source_batches,
             "an anchor-only source needs data.same_source_batches (a batch is anchor-only or not)"),
        ]
        for field_name, ok, message in checks:
            if not ok:
                raise ConfigError(f"{name}.{field_name}: {message}")
        seen.add(source.name)
    if all(source.loss == "anchor" for source in data.sources):
        raise ConfigError("data.sources: every source is anchor-only (loss: anchor); at least one must train")


def load_config(path_or_url: str, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a YAML training config (any fsspec URL), apply ``overrides`` (dotted keys), validate; a
    ``ConfigError`` names the file and the field."""
    values = read_yaml(path_or_url)
    for dotted, value in (overrides or {}).items():
        target = values
        *parents, last = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    with naming_file(path_or_url):
        return from_dict(TrainConfig, values)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Command-line ``key.sub=value`` overrides, values parsed as YAML scalars."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r}: an override must be key=value")
        overrides[key] = yaml.safe_load(value)
    return overrides


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


@dataclass
class MergeConfig:
    first: str  # checkpoint at t = 0 (the base model, or an earlier stage)
    second: str  # checkpoint at t = 1 (the fine-tuned model, or a later stage)
    output: str
    t: float = 0.5  # the weight, unless ``sweep`` chooses it
    method: Literal["slerp", "linear"] = "slerp"
    # "linear": layer i of L moves t·i/(L - 1) of the way, the embeddings stay at ``first`` (LiNeS; see
    # ``embedlib.training.merge.depth_shares``); "none": every tensor moves t.
    layer_scaling: Literal["none", "linear"] = "none"
    # Sweep: the weights tried, each scored on the held-out (never trained on) queries of ``dev``; the best
    # mean is saved at ``output``, the curve beside it (merge_sweep.json / .png).
    sweep: list[float] | None = None
    # the smallest weight that keeps this share of the best mean dev gain over ``first`` (t = 0); null: the best
    # mean. The dev sets cover only the trained domains, where more weight on ``second`` tends to look better,
    # while the domains never trained on tend to lose as the weight moves away from ``first``.
    keep_gain: float | None = None
    dev: list[SourceConfig] | None = None  # the training config's sources, same holdout and seed
    # Guard sets: sources of domains ``second`` never trained on (beir / q2q: the queries outside the held-out split,
    # which stays unseen; spans: span pairs), scored at every weight. The weight chosen is at most the largest one up
    # to which no guard set falls from its t = 0 score: by ``guard_rule`` "score", its score is no more than
    # ``guard_tolerance`` below; by "bootstrap", the paired-bootstrap 95% interval of its per-query change does not
    # lie wholly more than ``guard_tolerance`` below zero (so a dip within the guard queries' noise does not stop it).
    guard: list[SourceConfig] | None = None
    guard_tolerance: float = 0.0
    guard_rule: Literal["score", "bootstrap"] = "score"
    dev_max_docs: int | None = 2000  # dev corpus cap: judged documents of the held-out queries, then others
    max_length: int = 128  # token cap when encoding the dev sets
    quantization: Literal["float", "int8", "binary"] = "int8"  # the served path the dev scores use
    cache: str | None = None  # embedding cache (``embedlib.eval.embeddings``)
    # Binary centre of the merged model (its weights are neither end's, so neither end's centre fits): the mean
    # embedding of up to ``binary_centre_docs`` positives of the pair/triplet rows at ``binary_centre_data`` (the
    # training config's ``data.url``), drawn with seed 0; 0: none, binary codes stay ``sign(x)``.
    binary_centre_docs: int = 0
    binary_centre_data: str | None = None

    def __post_init__(self) -> None:
        if self.binary_centre_docs < 0:
            raise ConfigError(f"binary_centre_docs: must be >= 0, got {self.binary_centre_docs}")
        if self.binary_centre_docs and not self.binary_centre_data:
            raise ConfigError("binary_centre_data: binary_centre_docs needs the training rows to fit the centre on")
        if self.binary_centre_data and not self.binary_centre_docs:
            raise ConfigError("binary_centre_docs: binary_centre_data is set, so say how many documents (>= 1)")
        if self.keep_gain is not None and not 0.0 < self.keep_gain <= 1.0:
            raise ConfigError(f"keep_gain: must be in (0, 1] or null, got {self.keep_gain}")
        if self.keep_gain is not None and self.sweep and 0.0 not in self.sweep:
            raise ConfigError("keep_gain: the sweep must include t = 0 (the gain is measured from it)")
        for name, value in [("t", self.t), *((f"sweep[{i}]", w) for i, w in enumerate(self.sweep or []))]:
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name}: must be in [0, 1], got {value}")
        if self.sweep is not None and not self.sweep:
            raise ConfigError("sweep: must list at least one weight (or be null)")
        if self.sweep and not self.dev:
            raise ConfigError("dev: a sweep needs dev sources to score the weights on")
        for i, source in enumerate(self.dev or []):
            if source.kind == "spans" or source.holdout <= 0:
                raise ConfigError(f"dev[{i}].holdout: a dev source needs a held-out split (holdout > 0, beir or q2q)")
        if self.dev_max_docs is not None and self.dev_max_docs < 1:
            raise ConfigError("dev_max_docs: must be >= 1 or null")
        if self.guard and not self.sweep:
            raise ConfigError("guard: guard sets only act on a sweep (set sweep)")
        if self.guard and 0.0 not in self.sweep:
            raise ConfigError("guard: the sweep must include t = 0 (guard scores are compared with it)")
        if self.guard_tolerance < 0:
            raise ConfigError(f"guard_tolerance: must be >= 0, got {self.guard_tolerance}")
        seen: set[str] = set()
        for key, sources in (("dev", self.dev or []), ("guard", self.guard or [])):
            for i, source in enumerate(sources):
                if source.name in seen:
                    raise ConfigError(f"{key}[{i}].name: {source.name!r} names another dev or guard set already "
                                      "(their scores are reported by name)")
                seen.add(source.name)


def load_merge_config(path_or_url: str) -> MergeConfig:
    """Read and validate a YAML merge config; a ``ConfigError`` names the file and the field."""
    values = read_yaml(path_or_url)
    with naming_file(path_or_url):
        return from_dict(MergeConfig, values)
