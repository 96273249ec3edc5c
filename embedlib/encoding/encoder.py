"""``Encoder``: text in, mean-pooled float / INT8 / binary embeddings out."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from embedlib import storage
from embedlib.encoding.batching import pad_batch, plan_batches
from embedlib.encoding.formats import QUANTIZATIONS, Quantization, output_dtype, output_width
from embedlib.encoding.pooling import Pooling
from embedlib.encoding.quantize import quantize, truncate
from embedlib.models.loading import (
    BINARY_CENTRE_FILE,
    Backbone,
    WrapsModel,
    binary_centre_json,
    load_backbone,
    state_dict_hash,
    write_sentence_transformers_config,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS_PER_BATCH = 16_384
DEFAULT_BATCH_SIZE = 128


@dataclass
class EncodeStats:
    """What the last ``encode``/``encode_tokens`` call did."""

    texts: int = 0
    tokens: int = 0
    truncated: int = 0
    batches: int = 0
    lengths: list[int] = field(default_factory=list)  # tokens of each text after truncation, input order


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list; ``TypeError`` naming the first position that is not a string."""
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, got a single str")
    texts = list(texts)
    for position, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{position}] is {type(text).__name__}, expected str")
    return texts


@dataclass
class Chunk:
    """One late-chunking span of a text: its vector and character span in the text."""

    vector: np.ndarray
    start: int
    end: int


def chunk_spans(offsets: np.ndarray, chunk_tokens: int) -> list[tuple[np.ndarray, int, int]]:
    """Token positions and character span of each chunk of ``chunk_tokens`` content tokens."""
    content = np.flatnonzero(offsets[:, 1] > offsets[:, 0])
    if content.size == 0:
        return [(np.arange(len(offsets)), 0, 0)]
    spans = []
    for first in range(0, content.size, chunk_tokens):
        positions = content[first : first + chunk_tokens]
        spans.append((positions, int(offsets[positions, 0].min()), int(offsets[positions, 1].max())))
    return spans


class Encoder(WrapsModel):
    """A bidirectional encoder with mean pooling and INT8/binary quantization (pplx-embed §4.3).

    The pooling is the backbone's (``Backbone.pooling``, read from the checkpoint): ``mean`` unless the
    checkpoint says otherwise (the causal ablation's ``last_token``).
    """

    def __init__(self, backbone: Backbone):
        self.backbone = backbone
        self.pooling = Pooling(backbone.pooling)
        self.model = backbone.model
        self.tokenizer = backbone.tokenizer
        self.max_length = backbone.max_length
        self.source = backbone.source
        self.last_stats = EncodeStats()
        self.truncated_total = 0
        self._weights_hash: str | None = None

    @classmethod
    def from_pretrained(
        cls,
        path_or_url: str | os.PathLike,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        max_length: int | None = None,
    ) -> Encoder:
        """Load from a checkpoint folder: a local path or any fsspec URL (downloads are cached locally)."""
        return cls(load_backbone(path_or_url, device=device, dtype=dtype, max_length=max_length))

    # --- properties -------------------------------------------------------------------------------------

    @property
    def binary_centre(self) -> np.ndarray | None:
        """What binary codes are centred on (``sign(x - centre)``), from the checkpoint; None: ``sign(x)``."""
        return self.backbone.binary_centre

    @property
    def weights_hash(self) -> str:
        """sha256 over every parameter and buffer (name, dtype, shape, bytes): identifies the weights."""
        if self._weights_hash is None:
            self._weights_hash = state_dict_hash(self.model)
        return self._weights_hash

    # --- tokenization -----------------------------------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Token ids of each text, truncated to ``max_length``, and how many texts were truncated."""
        texts = check_texts(texts)
        if not texts:
            return [], 0
        encoded = self.tokenizer(
            texts,
            truncation=True,
            max_length=self.max_length,
            return_overflowing_tokens=True,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        samples = encoded["overflow_to_sample_mapping"]
        rows_per_text = np.bincount(samples, minlength=len(texts))
        first_row = {}
        for row, sample in enumerate(samples):
            first_row.setdefault(sample, row)
        # A text with no tokens at all (an empty string on a tokenizer without special tokens) is read as
        # the end-of-text token alone, so that every sequence has at least one position to pool.
        fallback = [self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None
                    else self.tokenizer.pad_token_id]
        ids = [encoded["input_ids"][first_row[i]] or fallback for i in range(len(texts))]
        return ids, int((rows_per_text > 1).sum())

    # --- forward ----------------------------------------------------------------------------------------

    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last-layer token states ``(B, L, d)``."""
        output = self.model(
            input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)
        )
        return output.last_hidden_state

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Pooled float embeddings ``(B, d)`` (differentiable; the model's mode is left as it is)."""
        return self.pooling(self.token_states(input_ids, attention_mask), attention_mask)

    def _batches(
        self, texts: Sequence[str], batch_size: int, max_tokens_per_batch: int, show_progress: bool, what: str
    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
        ids, truncated = self.tokenize(texts)
        lengths = [len(x) for x in ids]
        self.last_stats = EncodeStats(texts=len(ids), tokens=sum(lengths), truncated=truncated, lengths=lengths)
        self.truncated_total += truncated
        if truncated:
            log.warning("%d of %d texts were longer than max_length=%d tokens and were truncated",
                        truncated, len(ids), self.max_length)
        plan = plan_batches(lengths, max_tokens_per_batch, batch_size)
        self.last_stats.batches = len(plan)
        pad_id = self.tokenizer.pad_token_id
        with tqdm(total=len(ids), desc=what, unit="text", disable=not show_progress) as bar:
            for batch in plan:
                input_ids, attention_mask = pad_batch([ids[i] for i in batch], pad_id)
                yield batch, input_ids, attention_mask
                bar.update(len(batch))

    @torch.inference_mode()
    def encode(
        self,
        texts: Sequence[str],
        quantization: Quantization = "int8",
        dim: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_tokens_per_batch: int = DEFAULT_MAX_TOKENS_PER_BATCH,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Embed ``texts``: int8 ``(n, d)``, packed binary uint8 ``(n, ceil(d/8))`` or float32 ``(n, d)``.

        Outputs are in input order; ``dim`` truncates (Matryoshka) before quantization.
        """
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        width = dim if dim is not None else self.dim
        if not 0 < width <= self.dim:
            raise ValueError(f"dim must be in 1..{self.dim}, got {dim}")
        texts = check_texts(texts)
        out = np.zeros((len(texts), output_width(width, quantization)), dtype=output_dtype(quantization))
        for batch, input_ids, attention_mask in self._batches(
            texts, batch_size, max_tokens_per_batch, show_progress, "encode"
        ):
            pooled = truncate(self.pooled(input_ids, attention_mask).float(), dim)
            out[batch] = quantize(pooled, quantization, self.binary_centre)
        return out

    @torch.inference_mode()
    def encode_tokens(
        self,
        texts: Sequence[str],
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_tokens_per_batch: int = DEFAULT_MAX_TOKENS_PER_BATCH,
        show_progress: bool = False,
    ) -> list[np.ndarray]:
        """Last-layer token states of each text without padding: a list of float32 ``(L_i, d)``."""
        texts = check_texts(texts)
        out: list[np.ndarray | None] = [None] * len(texts)
        for batch, input_ids, attention_mask in self._batches(
            texts, batch_size, max_tokens_per_batch, show_progress, "encode tokens"
        ):
            states = self.token_states(input_ids, attention_mask).float().cpu().numpy()
            lengths = attention_mask.sum(dim=1).tolist()
            for row, index in enumerate(batch):
                out[index] = states[row, : lengths[row]].copy()
        return out  # type: ignore[return-value]

    def token_offsets(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Character ``(start, end)`` of every token (special tokens ``(0, 0)``), truncated like ``tokenize``."""
        encoded = self.tokenizer(
            check_texts(texts),
            truncation=True,
            max_length=self.max_length,
            return_offsets_mapping=True,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return [np.asarray(o, dtype=np.int32).reshape(-1, 2) for o in encoded["offset_mapping"]]

    def encode_chunks(
        self,
        texts: Sequence[str],
        chunk_tokens: int,
        quantization: Quantization = "int8",
        dim: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_tokens_per_batch: int = DEFAULT_MAX_TOKENS_PER_BATCH,
    ) -> list[list[Chunk]]:
        """Late chunking: each text is encoded once and every span of ``chunk_tokens`` content tokens is
        mean-pooled from the whole text's token states, then truncated and quantized like ``encode``."""
        states = self.encode_tokens(texts, batch_size, max_tokens_per_batch)
        out = []
        for text_states, offsets in zip(states, self.token_offsets(texts), strict=True):
            spans = chunk_spans(offsets, chunk_tokens)
            pooled = torch.stack([torch.from_numpy(text_states[positions].mean(axis=0)) for positions, _, _ in spans])
            codes = quantize(truncate(pooled, dim), quantization, self.binary_centre)
            out.append([Chunk(code, start, end) for code, (_, start, end) in zip(codes, spans, strict=True)])
        return out

    # --- saving -----------------------------------------------------------------------------------------

    def save_pretrained(self, path_or_url: str | os.PathLike) -> None:
        """Write a checkpoint folder that ``Encoder.from_pretrained`` and ``SentenceTransformer`` both load."""
        if storage.is_local(path_or_url):
            self._save_local(Path(storage.strip_file_scheme(path_or_url)))
            return
        with tempfile.TemporaryDirectory() as tmp:
            self._save_local(Path(tmp))
            storage.upload_dir(tmp, path_or_url)

    def _save_local(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)
        write_sentence_transformers_config(folder, self.dim, self.max_length, self.pooling.mode)
        if self.binary_centre is not None:
            fitted_on = {"copied_from": self.source}
            (folder / BINARY_CENTRE_FILE).write_text(binary_centre_json(self.binary_centre, fitted_on))

    def binary_centre_file(self, texts: Sequence[str], fitted_on: dict) -> str:
        """``binary_centre.json`` for this model: the mean float embedding of ``texts`` (sample documents)."""
        centre = self.encode(texts, quantization="float").mean(axis=0)
        return binary_centre_json(centre, {"docs": len(texts), **fitted_on})
