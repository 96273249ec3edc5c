"""Representative tokens (DiffRetriever, 2026; PromptReps, Zhuang et al. 2024): dense + sparse from an LM head.

The text is wrapped in an instruction ending in ``The words are: "``. DiffRetriever appends K mask tokens and
a short tail and runs ONE bidirectional forward pass of a diffusion LM; at the K predicting positions it reads
K dense states (multi-vector, L2-normalised) and K vocabulary logit vectors. The PromptReps baseline runs the
same instruction through a causal LM and generates K tokens greedily: K forward passes.

Sparse vector: ``log(1 + ReLU(logits))`` max-pooled over the K positions, special/out-of-tokenizer ids
dropped, the ``top_terms`` largest kept.

The predicting position of mask ``p`` is ``p - logits_shift`` (Dream predicts the next token, LLaDA and
embedlib's own models the masked one); dense states are read there too, so each dense vector is the state
the LM head turned into that slot's word distribution.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from embedlib import storage
from embedlib.encoding.batching import pad_batch, plan_batches
from embedlib.encoding.encoder import EncodeStats, check_texts
from embedlib.encoding.representative_defaults import (  # noqa: F401 (DEFAULT_K_*: importable from here too)
    DEFAULT_K_PASSAGE,
    DEFAULT_K_QUERY,
    DEFAULT_TOP_TERMS,
)
from embedlib.models.bidirectional import bidirectional_attention_mask
from embedlib.models.diffusion_lm import DiffusionLM, load_causal_lm, load_diffusion_lm, save_diffusion_lm
from embedlib.models.loading import state_dict_hash

Kind = Literal["query", "passage"]
KINDS = ("query", "passage")


@dataclass(frozen=True)
class PromptTemplate:
    """The representative-token instruction; ``{k}`` and ``{kind}`` are filled in."""

    prefix: str = '{Kind}: "'
    instruction: str = (
        '".\nUse {k} words to represent the {kind} above in a retrieval task. '
        'Make sure the words are in lowercase.\nThe words are: "'
    )
    tail: str = '".'

    def __post_init__(self) -> None:
        if not self.instruction.endswith('The words are: "'):
            raise ValueError("PromptTemplate.instruction must end with 'The words are: \"'")

    def parts(self, k: int, kind: Kind) -> tuple[str, str]:
        """The text before and after the wrapped text (the latter ending in ``The words are: "``)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        values = {"k": k, "kind": kind, "Kind": kind.capitalize()}
        return self.prefix.format(**values), self.instruction.format(**values)


@dataclass
class RepresentativeTokens:
    """Per text: ``dense[i]`` float32 ``(K, d)`` (unit rows); ``sparse`` CSR ``(n, vocab)`` term weights."""

    dense: list[np.ndarray]
    sparse: sp.csr_matrix
    k: int

    def __len__(self) -> int:
        return len(self.dense)

    def head(self, n: int) -> RepresentativeTokens:
        """The first ``n`` texts' tokens."""
        return RepresentativeTokens(dense=self.dense[:n], sparse=self.sparse[:n], k=self.k)


@dataclass
class RepresentativeStats(EncodeStats):
    """What the last ``encode`` call did, and how many forward passes it took."""

    forward_passes: int = 0


def check_k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k (number of representative tokens) must be an integer >= 1, got {k!r}")
    return k


def excluded_term_ids(tokenizer, vocab_size: int) -> np.ndarray:
    """Vocabulary ids a sparse vector never uses: special tokens and ids beyond the tokenizer's vocabulary."""
    excluded = np.zeros(vocab_size, dtype=bool)
    excluded[min(len(tokenizer), vocab_size) :] = True
    special = [i for i in tokenizer.all_special_ids if i is not None and 0 <= i < vocab_size]
    excluded[special] = True
    return excluded


def term_weights(logits: torch.Tensor, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """``log(1+ReLU(logits))`` max-pooled over K ``(B, K, V) -> (B, V)``, ``excluded`` ids (bool ``(V,)``) 0."""
    weights = torch.log1p(torch.relu(logits.float())).amax(dim=1)
    if excluded is not None:
        weights = weights.masked_fill(excluded.to(weights.device), 0.0)
    return weights


def sparse_from_logits(logits: torch.Tensor, excluded: torch.Tensor, top_terms: int) -> sp.csr_matrix:
    """:func:`term_weights`, top ``top_terms`` per row: ``(B, K, V) -> CSR (B, V)``."""
    weights = term_weights(logits, excluded)
    keep = min(top_terms, weights.shape[1])
    values, ids = torch.topk(weights, keep, dim=1)
    values, ids = values.cpu().numpy(), ids.cpu().numpy()
    rows = np.repeat(np.arange(len(values)), keep)
    nonzero = values.reshape(-1) > 0
    return sp.csr_matrix(
        (values.reshape(-1)[nonzero], (rows[nonzero], ids.reshape(-1)[nonzero])),
        shape=weights.shape,
        dtype=np.float32,
    )


def unit_rows(states: torch.Tensor) -> np.ndarray:
    """Float32 copies of ``states`` with L2-normalised last dimension."""
    return torch.nn.functional.normalize(states.float(), dim=-1).cpu().numpy()


class _RepresentativeBase:
    """Prompt building, truncation and the encode loop shared by the diffusion and autoregressive encoders.

    A subclass says how its prompts end (``encode_prompts``), how a batch of them is read into states and
    logits at the K positions (``read_batch``), and how many forward passes that takes.
    """

    name: str

    def __init__(self, model, tokenizer, max_length: int, template: PromptTemplate | None, top_terms: int):
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.template = template or PromptTemplate()
        self.top_terms = top_terms
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.excluded = torch.as_tensor(excluded_term_ids(tokenizer, self.vocab_size))  # never sparse terms
        self.last_stats = RepresentativeStats()

    def encode_prompts(self, texts: Sequence[str], k: int, kind: Kind) -> tuple[list[list[int]], int]:
        """The prompt ids the model reads, and how many texts were truncated."""
        raise NotImplementedError

    def batch_tokens(self, prompt: list[int], k: int) -> int:
        """Tokens a prompt occupies in a batch (for the token budget)."""
        return len(prompt)

    def read_batch(self, prompts: list[list[int]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(states (B, K, d), logits (B, K, V))`` of a batch of prompts."""
        raise NotImplementedError

    def passes_per_batch(self, k: int) -> int:
        return 1

    @torch.inference_mode()
    def encode(
        self,
        texts: Sequence[str],
        k: int,
        kind: Kind = "passage",
        batch_size: int = 64,
        max_tokens_per_batch: int = 16_384,
        show_progress: bool = False,
    ) -> RepresentativeTokens:
        """Dense ``(K, d)`` and sparse vectors of ``texts`` in input order."""
        ids, truncated = self.encode_prompts(texts, check_k(k), kind)
        plan = plan_batches([self.batch_tokens(x, k) for x in ids], max_tokens_per_batch, batch_size)
        self.last_stats = RepresentativeStats(texts=len(ids), truncated=truncated, batches=len(plan))
        return self.collect(ids, plan, k, desc=f"{self.name} {kind} k={k}", show_progress=show_progress)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(
        self,
        texts: Sequence[str],
        k: int,
        kind: Kind,
        masks: list[int],
        tail: list[int],
        max_text_tokens: int | None = None,
    ) -> tuple[list[list[int]], int]:
        """``prefix + text + instruction + masks + tail`` ids per text, the text cut to fit ``max_length``
        (and ``max_text_tokens`` when given); and how many texts were cut."""
        prefix, instruction = self.template.parts(k, kind)
        head, middle = self._ids(prefix), self._ids(instruction)
        budget = self.max_length - len(head) - len(middle) - len(masks) - len(tail)
        if budget < 1:
            raise ValueError(
                f"max_length={self.max_length} leaves no room for text with k={k} "
                f"({len(head) + len(middle) + len(masks) + len(tail)} prompt tokens)"
            )
        if max_text_tokens is not None:
            budget = min(budget, max_text_tokens)
        texts = check_texts(texts)
        bodies = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        truncated = sum(len(body) > budget for body in bodies)
        return [head + body[:budget] + middle + masks + tail for body in bodies], truncated

    def collect(
        self, ids: list[list[int]], plan: list[list[int]], k: int, desc: str, show_progress: bool
    ) -> RepresentativeTokens:
        """Run ``read_batch`` over the planned batches; the dense and sparse vectors come back in input order."""
        dense: list[np.ndarray | None] = [None] * len(ids)
        rows: list[sp.csr_matrix] = []
        order: list[int] = []
        for batch in tqdm(plan, desc=desc, unit="batch", disable=not show_progress):
            states, logits = self.read_batch([ids[i] for i in batch], k)
            self.last_stats.forward_passes += self.passes_per_batch(k)
            for row, vectors in zip(batch, unit_rows(states), strict=True):
                dense[row] = vectors
            rows.append(sparse_from_logits(logits, self.excluded.to(logits.device), self.top_terms))
            order.extend(batch)
        return RepresentativeTokens(dense=dense, sparse=restore_order(rows, order, self.vocab_size), k=k)


class DiffRetrieverEncoder(_RepresentativeBase):
    """K representative tokens from ONE bidirectional forward pass of a diffusion LM."""

    name = "diffretriever"

    def __init__(
        self, lm: DiffusionLM, template: PromptTemplate | None = None, top_terms: int = DEFAULT_TOP_TERMS
    ):
        super().__init__(lm.model, lm.tokenizer, lm.max_length, template, top_terms)
        self.lm = lm
        if not 0 <= lm.mask_token_id < self.vocab_size:
            raise ValueError(
                f"{storage.redact_url(lm.source)}: mask_token_id {lm.mask_token_id} is outside the LM head's "
                f"{self.vocab_size} outputs"
            )
        self.excluded[lm.mask_token_id] = True

    @classmethod
    def from_pretrained(
        cls, path_or_url: str | os.PathLike, device=None, dtype=None, max_length: int | None = None, **options
    ) -> DiffRetrieverEncoder:
        """Load a Dream, LLaDA or embedlib diffusion checkpoint (local path or fsspec URL); ``options`` are the
        constructor's (``template``, ``top_terms``)."""
        return cls(load_diffusion_lm(path_or_url, device=device, dtype=dtype, max_length=max_length), **options)

    @property
    def dim(self) -> int:
        return self.lm.dim

    @property
    def weights_hash(self) -> str:
        """sha256 of the LM's weights (head included): what an index built with it records."""
        if getattr(self, "_weights_hash", None) is None:
            self._weights_hash = state_dict_hash(self.model)
        return self._weights_hash

    def masked_prompts(
        self, texts: Sequence[str], k: int, kind: Kind, max_text_tokens: int | None = None
    ) -> tuple[list[list[int]], int]:
        """Prompt ids ending in K mask tokens and the tail, and how many texts were truncated."""
        masks = [self.lm.mask_token_id] * check_k(k)
        return self.prompt_ids(texts, k, kind, masks, self._ids(self.template.tail), max_text_tokens)

    def save_pretrained(self, path_or_url: str | os.PathLike) -> None:
        """Write the LM (head, mask token id and on-disk format kept) so ``from_pretrained`` loads it."""
        save_diffusion_lm(self.lm, path_or_url)

    def states_and_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One bidirectional pass over right-padded prompts: last-layer states ``(B, K, d)`` and logits
        ``(B, K, V)`` at the K predicting positions (the LM head runs on those positions only)."""
        device = self.lm.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        body = self.model.model
        embeds = body.embed_tokens(input_ids)
        mask = bidirectional_attention_mask(self.model.config, embeds, attention_mask)
        hidden = body(inputs_embeds=embeds, attention_mask=mask, use_cache=False).last_hidden_state
        positions = mask_positions(input_ids, self.lm.mask_token_id, k) - self.lm.logits_shift
        states = torch.gather(hidden, 1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        return states, self.model.get_output_embeddings()(states)

    def encode_prompts(self, texts: Sequence[str], k: int, kind: Kind) -> tuple[list[list[int]], int]:
        return self.masked_prompts(texts, k, kind)

    def read_batch(self, prompts: list[list[int]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.states_and_logits(*pad_batch(prompts, self.tokenizer.pad_token_id), k)


def mask_positions(input_ids: torch.Tensor, mask_token_id: int, k: int) -> torch.Tensor:
    """Column of each of the K mask tokens per row ``(B, K)``; an error if a row does not have exactly K."""
    is_mask = input_ids == mask_token_id
    counts = is_mask.sum(dim=1)
    if bool((counts != k).any()):
        raise ValueError(
            f"every prompt must hold exactly k={k} mask tokens, found {counts.tolist()} "
            f"(does the text contain the mask token?)"
        )
    return is_mask.nonzero()[:, 1].view(-1, k)


def restore_order(rows: list[sp.csr_matrix], order: list[int], vocab_size: int) -> sp.csr_matrix:
    """Stack per-batch CSR rows and put them back in input order."""
    if not rows:
        return sp.csr_matrix((0, vocab_size), dtype=np.float32)
    stacked = sp.vstack(rows, format="csr")
    return stacked[np.argsort(np.asarray(order))]


class PromptRepsEncoder(_RepresentativeBase):
    """The autoregressive baseline: the same instruction on a causal LM, K tokens generated greedily."""

    name = "promptreps"

    def __init__(
        self,
        model,
        tokenizer,
        max_length: int = 512,
        template: PromptTemplate | None = None,
        top_terms: int = DEFAULT_TOP_TERMS,
        use_cache: bool = True,
    ):
        super().__init__(model, tokenizer, max_length, template, top_terms)
        self.use_cache = use_cache  # False: every step re-reads the whole prefix (K full forward passes)

    @classmethod
    def from_pretrained(cls, path_or_url: str | os.PathLike, device=None, dtype=None, **options) -> PromptRepsEncoder:
        """Load a causal LM; ``options`` are the constructor's (``max_length``, ``template``, ``top_terms``,
        ``use_cache``)."""
        return cls(*load_causal_lm(path_or_url, device=device, dtype=dtype), **options)

    @torch.inference_mode()
    def generate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding of K tokens (K forward passes, KV cache if enabled): per step the last-layer state that
        predicted the token ``(B, K, d)`` and its logits ``(B, K, V)``."""
        device = next(self.model.parameters()).device
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=k,
            min_new_tokens=k,
            do_sample=False,
            output_logits=True,
            output_hidden_states=True,
            return_dict_in_generate=True,
            pad_token_id=self.tokenizer.pad_token_id,
            use_cache=self.use_cache,
        )
        states = torch.stack([step[-1][:, -1, :] for step in out.hidden_states], dim=1)
        logits = torch.stack(list(out.logits), dim=1)
        return states, logits

    def encode_prompts(self, texts: Sequence[str], k: int, kind: Kind) -> tuple[list[list[int]], int]:
        return self.prompt_ids(texts, k, kind, [], [])  # the K tokens are generated, not in the prompt

    def batch_tokens(self, prompt: list[int], k: int) -> int:
        return len(prompt) + k

    def read_batch(self, prompts: list[list[int]], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.generate(*left_pad_batch(prompts, self.tokenizer.pad_token_id), k)

    def passes_per_batch(self, k: int) -> int:
        return k  # greedy decoding: one forward pass per generated token


def left_pad_batch(token_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(input_ids, attention_mask)`` (generation appends on the right)."""
    input_ids, attention_mask = pad_batch([list(reversed(ids)) for ids in token_ids], pad_id)
    return input_ids.flip(1), attention_mask.flip(1)
