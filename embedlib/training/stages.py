"""What each stage trains: a ``torch.nn.Module`` whose forward turns a collated batch into a loss.

The modules are built from the encoder core (``load_backbone``, ``Encoder.tokenize``/``Encoder.pooled``,
``truncate`` + ``int8_straight_through`` via the objectives) so what is trained is what ``Encoder`` serves.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from embedlib.encoding.batching import pad_batch
from embedlib.encoding.encoder import Encoder
from embedlib.encoding.representative_tokens import DiffRetrieverEncoder
from embedlib.models.diffusion_lm import load_diffusion_lm
from embedlib.models.loading import load_backbone
from embedlib.models.mask_token import resolve_mask_id
from embedlib.objectives import (
    contextual_beta,
    contextual_loss,
    diffusion_loss,
    mask_for_diffusion,
    matryoshka,
    pair_loss,
)
from embedlib.objectives.contrastive import (
    PAIR_TEMPERATURE,
    TRIPLET_TEMPERATURE,
    anchor_loss,
    both,
    not_judged_relevant,
    same_source_other_query,
    triplet_loss,
)
from embedlib.objectives.representative import DIFFRETRIEVER_TEMPERATURE, diffretriever_loss
from embedlib.training import causal_ablation
from embedlib.training.config import TrainConfig

log = logging.getLogger(__name__)


def text_hash(text: str) -> int:
    """A signed 64-bit content hash (the duplicate-document mask compares these)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def hard_negatives(rows: dict, column: str, k: int) -> list:
    """The first ``k`` entries of each row's ``column`` list (``negatives`` or their ids), flattened row-major."""
    lists = [list(n)[:k] for n in rows[column]]
    if any(len(n) < k for n in lists):
        raise ValueError(f"triplet rows need {k} negatives (hard_negatives)")
    return [x for n in lists for x in n]


def anchor_only_batch(rows: dict) -> bool:
    """Whether a batch's rows come from an anchor-only source (``loss: anchor``): all of them, or none."""
    flags = {bool(flag) for flag in rows.get("anchor_only", ())}
    if len(flags) > 1:
        raise ValueError("a batch mixes anchor-only rows with training rows (data.same_source_batches is needed)")
    return flags == {True}


def padded(encoder: Encoder, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    ids, _ = encoder.tokenize(list(texts))
    input_ids, attention_mask = pad_batch([x[:max_length] for x in ids], encoder.tokenizer.pad_token_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


# --- pretraining -------------------------------------------------------------------------------------------


class DiffusionObjective(torch.nn.Module):
    """Masked-diffusion LM objective on a bidirectional decoder with its LM head (§4.2)."""

    def __init__(self, lm: torch.nn.Module, mask_id: int, seed: int):
        super().__init__()
        self.lm = lm
        self.mask_id = mask_id
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        noisy, masked, t = mask_for_diffusion(input_ids, attention_mask, self.mask_id, self.generator)
        logits = self.lm(input_ids=noisy, attention_mask=attention_mask).logits
        loss, accuracy = diffusion_loss(logits, input_ids, masked, t.to(logits.device), attention_mask)
        return {"loss": loss, "accuracy": accuracy}


class NextTokenLM(torch.nn.Module):
    """Ablation (b): next-token prediction on a causal decoder."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits
        loss, accuracy = causal_ablation.next_token_loss(logits, input_ids, attention_mask)
        return {"loss": loss, "accuracy": accuracy}


# --- contrastive stages --------------------------------------------------------------------------------------


class ContrastiveModel(torch.nn.Module):
    """An ``Encoder``'s backbone with the loss of a contrastive stage on INT8 straight-through embeddings.

    ``anchor``: a frozen copy of the starting model (``cfg.anchor_weight`` > 0), which the forgetting guard
    pulls the trained embeddings toward."""

    def __init__(self, encoder: Encoder, cfg: TrainConfig, anchor: torch.nn.Module | None = None):
        super().__init__()
        self.backbone = encoder.model
        self.encoder = encoder
        self.cfg = cfg
        self.anchor = anchor
        self.dims = [*(cfg.matryoshka_dims or []), None]
        self.progress = 0.0  # contextual β schedule: fraction of training done, set by the runner

    def embed(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.encoder.pooled(batch["input_ids"], batch["attention_mask"])

    def train(self, mode: bool = True) -> ContrastiveModel:
        super().train(mode)
        if self.anchor is not None:
            self.anchor.eval()  # the reference stays deterministic: no dropout
        return self

    @torch.no_grad()
    def embed_anchored(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The starting model's pooled embeddings of the same texts."""
        mask = batch["attention_mask"].to(self.encoder.device)
        states = self.anchor(input_ids=batch["input_ids"].to(self.encoder.device), attention_mask=mask)
        return self.encoder.pooling(states.last_hidden_state, mask)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        stage, cfg = self.cfg.stage, self.cfg
        q = self.embed(batch["query"])
        if batch.get("anchor_only"):
            return self.anchored({"loss": torch.zeros((), device=q.device)}, batch, q, self.embed(batch["positive"]))
        keep = both(
            same_source_other_query(batch.get("source_hash"), batch.get("query_hash")),
            not_judged_relevant(batch.get("relevant_keys"), batch.get("doc_key")),
        )
        if stage == "contextual":
            return {"loss": self.contextual(batch, q)}
        d = self.embed(batch["positive"])
        if stage == "pair":
            temperature = cfg.temperature or PAIR_TEMPERATURE
            hashes = batch["doc_hash"]
            loss = matryoshka(
                lambda a, b: pair_loss(a, b, temperature, cfg.false_negative_margin, hashes, keep),
                [q, d],
                self.dims,
                cfg.binary_weight,
            )
        else:
            temperature = cfg.temperature or TRIPLET_TEMPERATURE
            negatives = self.embed(batch["negatives"]).view(q.shape[0], -1, q.shape[1])
            loss = matryoshka(
                lambda a, b, n: triplet_loss(a, b, n, temperature, keep),
                [q, d, negatives],
                self.dims,
                cfg.binary_weight,
            )
        return self.anchored({"loss": loss}, batch, q, d)

    def anchored(self, out: dict[str, torch.Tensor], batch: dict, q: torch.Tensor, d: torch.Tensor) -> dict:
        """``out`` with the forgetting guard's term added to its loss (when there is an anchor)."""
        if self.anchor is None:
            return out
        anchor = anchor_loss([q, d], [self.embed_anchored(batch["query"]), self.embed_anchored(batch["positive"])])
        return {"loss": out["loss"] + self.cfg.anchor_weight * anchor, "anchor_loss": anchor.detach()}

    def contextual(self, batch: dict, q: torch.Tensor) -> torch.Tensor:
        """Late chunking: one forward over each whole document, chunks mean-pooled over their token spans."""
        cfg = self.cfg
        doc = batch["document"]
        states = self.encoder.token_states(doc["input_ids"], doc["attention_mask"])
        spans = batch["spans"].to(states.dtype)  # (B, C, L): 1 on the chunk's tokens
        chunks = torch.einsum("bcl,bld->bcd", spans, states) / spans.sum(-1, keepdim=True).clamp(min=1)
        document = self.encoder.pooling(states, doc["attention_mask"])  # pooled as the encoder pools
        beta = contextual_beta(self.progress, *cfg.contextual_beta)
        return matryoshka(
            lambda a, dd, ch: contextual_loss(
                a,
                dd,
                ch,
                batch["chunk_valid"],
                batch["gold"],
                batch["doc_hash"],
                beta,
                cfg.temperature or PAIR_TEMPERATURE,
                cfg.contextual_alpha,
                cfg.false_negative_margin,
            ),
            [q, document, chunks],
            self.dims,
            cfg.binary_weight,
        )


# --- DiffRetriever -----------------------------------------------------------------------------------------------


class DiffRetrieverModel(torch.nn.Module):
    """A diffusion LM read at its K mask positions (one pass per side), trained on dense + sparse InfoNCE."""

    def __init__(self, encoder: DiffRetrieverEncoder, cfg: TrainConfig, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm  # what is trained: ``encoder.model``, or a PeftModel whose adapters are injected into it
        self.encoder = encoder
        self.cfg = cfg

    def read(self, prompts: dict[str, torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder.states_and_logits(prompts["input_ids"], prompts["attention_mask"], k)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        query_states, query_logits = self.read(batch["query"], cfg.k_query)
        passage_states, passage_logits = self.read(batch["passage"], cfg.k_passage)
        return diffretriever_loss(
            query_states,
            query_logits,
            passage_states,
            passage_logits,
            temperature=cfg.temperature or DIFFRETRIEVER_TEMPERATURE,
            sparse_weight=cfg.sparse_weight,
            passage_hashes=batch["passage_hash"],
            excluded=self.encoder.excluded,
        )

    def trained_encoder(self) -> DiffRetrieverEncoder:
        """The encoder to save: LoRA merged into the weights, in eval mode."""
        from embedlib.training.lora import merged

        lm = dataclasses.replace(self.encoder.lm, model=merged(self.lm).eval())
        return DiffRetrieverEncoder(lm, template=self.encoder.template, top_terms=self.encoder.top_terms)


def passage_keys(rows: dict, negatives: int) -> list:
    """Document ids of the positives then the negatives when the rows carry them all, else ``[]``."""
    if "doc_id" not in rows or (negatives and "negative_ids" not in rows):
        return []
    return [*rows["doc_id"], *(hard_negatives(rows, "negative_ids", negatives) if negatives else [])]


class DiffRetrieverCollator:
    """Pair / triplet rows -> masked prompts (the encoder's own builder): queries, then positives + negatives."""

    def __init__(self, encoder: DiffRetrieverEncoder, cfg: TrainConfig):
        self.encoder, self.cfg = encoder, cfg

    def prompts(self, texts: Sequence[str], k: int, kind: str, max_text_tokens: int) -> dict[str, torch.Tensor]:
        ids, _ = self.encoder.masked_prompts(texts, k, kind, max_text_tokens)
        input_ids, attention_mask = pad_batch(ids, self.encoder.tokenizer.pad_token_id)
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def __call__(self, rows: dict) -> dict:
        cfg = self.cfg
        passages = list(rows["positive"])
        negatives = hard_negatives(rows, "negatives", cfg.hard_negatives) if cfg.hard_negatives else []
        keys = passage_keys(rows, cfg.hard_negatives) or passages + negatives
        data = cfg.data
        return {
            "query": self.prompts(rows["query"], cfg.k_query, "query", data.query_max_length),
            "passage": self.prompts(passages + negatives, cfg.k_passage, "passage", data.max_length),
            "passage_hash": torch.tensor([text_hash(str(k)) for k in keys], dtype=torch.int64),
        }


# --- building a stage ------------------------------------------------------------------------------------------


@dataclass
class StageParts:
    module: torch.nn.Module  # what DeepSpeed wraps; forward(**collated) -> {"loss", ...}
    encoder: Encoder | DiffRetrieverEncoder  # tokenizer + (for contrastive stages) the encoder that gets saved
    collate: object  # rows (dict of lists) -> forward kwargs


def build_stage(cfg: TrainConfig, seed: int) -> StageParts:
    """Load the starting checkpoint and wrap it in the stage's loss module and collator."""
    if cfg.stage == "diffretriever":
        return build_diffretriever(cfg)
    if cfg.stage == "pretrain":
        if cfg.causal:
            backbone = causal_ablation.load_causal_backbone(
                cfg.model, with_lm_head=True, max_length=cfg.data.max_length
            )
            module = NextTokenLM(backbone.model)
        else:
            backbone = load_backbone(
                cfg.model, device="cpu", dtype="fp32", max_length=cfg.data.max_length, with_lm_head=True
            )
            module = DiffusionObjective(
                backbone.model,
                resolve_mask_id(backbone.tokenizer, cfg.mask_id, vocab_size=backbone.model.config.vocab_size),
                seed,
            )
        encoder = Encoder(backbone)
        return StageParts(module, encoder, PretrainCollator(encoder, cfg.data.max_length))
    if cfg.causal:
        backbone = causal_ablation.load_causal_backbone(cfg.model, max_length=cfg.data.max_length)
        encoder = Encoder(backbone)  # the causal backbone pools its last token
    else:
        backbone = load_backbone(cfg.model, device="cpu", dtype="fp32", max_length=cfg.data.max_length)
        encoder = Encoder(backbone)
    anchor = frozen_copy(encoder.model) if cfg.anchor_weight else None
    if cfg.lora is not None:
        from embedlib.training.lora import add_lora

        encoder.model = encoder.backbone.model = add_lora(encoder.model, cfg.lora)
    encoder.model.train()
    return StageParts(ContrastiveModel(encoder, cfg, anchor), encoder, ContrastiveCollator(encoder, cfg))


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` in eval mode with no trainable parameters."""
    anchor = copy.deepcopy(model).eval()
    anchor.requires_grad_(False)
    return anchor


def build_diffretriever(cfg: TrainConfig) -> StageParts:
    """A Dream / LLaDA / embedlib diffusion LM with its head, optionally with LoRA adapters."""
    encoder = DiffRetrieverEncoder(load_diffusion_lm(cfg.model, device="cpu", dtype="fp32"))
    lm = encoder.model
    if cfg.lora is not None:
        from embedlib.training.lora import add_lora

        lm = add_lora(lm, cfg.lora)  # adapters injected into encoder.model, which the forward runs
    lm.train()
    return StageParts(DiffRetrieverModel(encoder, cfg, lm), encoder, DiffRetrieverCollator(encoder, cfg))


class PretrainCollator:
    def __init__(self, encoder: Encoder, max_length: int):
        self.encoder, self.max_length = encoder, max_length

    def __call__(self, rows: dict) -> dict:
        return padded(self.encoder, rows["text"], self.max_length)


def chunk_window(
    ids_per_chunk: Sequence[Sequence[int]], gold: int, max_chunks: int, max_length: int
) -> tuple[int, list[tuple[int, int]], list[int]]:
    """The earliest run of consecutive chunks within ``max_chunks`` and ``max_length`` tokens that holds the
    gold chunk: ``(first chunk, token span of each chunk, token ids)``; a gold chunk longer than
    ``max_length`` on its own is truncated."""
    for first in range(gold + 1):
        ids: list[int] = []
        bounds: list[tuple[int, int]] = []
        for chunk_ids in ids_per_chunk[first : first + max_chunks]:
            if len(ids) + len(chunk_ids) > max_length:
                break
            bounds.append((len(ids), len(ids) + len(chunk_ids)))
            ids.extend(chunk_ids)
        if gold - first < len(bounds):
            return first, bounds, ids
    ids = list(ids_per_chunk[gold][:max_length])
    return gold, [(0, len(ids))], ids


def row_sources(rows: dict) -> list[str]:
    """Each row's source name ("" for rows from a single source)."""
    return [str(s) for s in rows["source"]] if "source" in rows else [""] * len(next(iter(rows.values())))


def document_key(source: str, doc_id: object) -> int:
    """A document's identity: ids are per source, so source "a"'s d1 is not source "b"'s d1."""
    return text_hash(f"{source}\x00{doc_id}")


def document_hashes(rows: dict, keys: Sequence) -> torch.Tensor:
    """``(B,)`` int64 :func:`document_key` of each row's document."""
    return torch.tensor([document_key(s, k) for s, k in zip(row_sources(rows), keys, strict=True)], dtype=torch.int64)


class ContrastiveCollator:
    """Tokenize a batch of pair / triplet / contextual rows into the forward's inputs."""

    def __init__(self, encoder: Encoder, cfg: TrainConfig):
        self.encoder, self.cfg = encoder, cfg

    def __call__(self, rows: dict) -> dict:
        cfg = self.cfg
        batch = {"query": padded(self.encoder, rows["query"], cfg.data.query_max_length)}
        if anchor_only_batch(rows):  # the anchor term needs no negatives and no masks
            return batch | {"positive": padded(self.encoder, rows["positive"], cfg.data.max_length), "anchor_only": True}
        if cfg.stage in ("pair", "triplet"):
            batch["positive"] = padded(self.encoder, rows["positive"], cfg.data.max_length)
        if cfg.stage == "pair":
            batch["doc_hash"] = document_hashes(rows, rows["doc_id"] if "doc_id" in rows else rows["positive"])
        if cfg.stage == "triplet":
            negatives = hard_negatives(rows, "negatives", cfg.hard_negatives)
            batch["negatives"] = padded(self.encoder, negatives, cfg.data.max_length)
        if cfg.stage == "contextual":
            batch.update(self.late_chunks(rows))
        batch.update(self.mixture_keys(rows))
        return batch

    def mixture_keys(self, rows: dict) -> dict[str, torch.Tensor]:
        """Hashes of each row's source and query (mixture rows), and of its positive and the documents judged
        relevant to its query (rows with ``relevant_ids``), which in-batch negatives are masked by."""
        keys = {}
        if "relevant_ids" in rows and "doc_id" in rows:
            keys["doc_key"] = document_hashes(rows, rows["doc_id"])
            relevant = [[document_key(s, d) for d in ids] or [int(k)] for s, ids, k in
                        zip(row_sources(rows), rows["relevant_ids"], keys["doc_key"], strict=True)]
            width = max(len(r) for r in relevant)
            keys["relevant_keys"] = torch.tensor([r + [r[0]] * (width - len(r)) for r in relevant], dtype=torch.int64)
        if self.cfg.same_source_negatives and "source" in rows:
            keys["source_hash"] = torch.tensor([text_hash(str(s)) for s in rows["source"]], dtype=torch.int64)
        if "query_id" in rows and "source" in rows:
            keys["query_hash"] = torch.tensor(
                [text_hash(f"{s}\x00{q}") for s, q in zip(rows["source"], rows["query_id"], strict=True)],
                dtype=torch.int64,
            )
        return keys

    def late_chunks(self, rows: dict) -> dict:
        """Documents as concatenated chunk tokens with each chunk's span, cut to a window of chunks that fits
        ``max_chunks`` and ``max_length`` and holds the gold chunk."""
        cfg = self.cfg
        documents, spans, golds = [], [], []
        for chunks, gold in zip(rows["chunks"], rows["gold"], strict=True):
            ids_per_chunk, _ = self.encoder.tokenize(list(chunks))
            first, bounds, ids = chunk_window(ids_per_chunk, int(gold), cfg.max_chunks, cfg.data.max_length)
            documents.append(ids)
            spans.append(bounds)
            golds.append(int(gold) - first)
        input_ids, attention_mask = pad_batch(documents, self.encoder.tokenizer.pad_token_id)
        span_mask = torch.zeros(len(documents), cfg.max_chunks, input_ids.shape[1])
        for row, bounds in enumerate(spans):
            for c, (start, end) in enumerate(bounds):
                span_mask[row, c, start:end] = 1.0
        keys = rows["doc_id"] if "doc_id" in rows else [" ".join(c) for c in rows["chunks"]]
        return {
            "document": {"input_ids": input_ids, "attention_mask": attention_mask},
            "spans": span_mask,
            "chunk_valid": span_mask.sum(-1) > 0,
            "gold": torch.tensor(golds, dtype=torch.long),
            "doc_hash": document_hashes(rows, keys),
        }
