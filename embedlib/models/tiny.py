"""Tiny randomly initialised checkpoints in the real on-disk formats, for tests and demos.

Real Qwen3/Dream/LLaDA weights are gigabytes and cannot be downloaded here; these folders have the same
files (``config.json``, ``model.safetensors``, tokenizer files) so the same loading code is exercised.
The tokenizer is a byte-level BPE trained on the given text (Qwen's tokenizer family), with Qwen's special
tokens and a ``<|mask|>`` token for diffusion training.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from embedlib.models.bidirectional import BidirectionalQwen3Model, to_bidirectional_config
from embedlib.models.loading import write_sentence_transformers_config

TINY_QWEN3_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
FAMILIES = ("qwen3-causal", "qwen3-bidirectional", "pplx-embed", "bert")


def bundled_text() -> list[str]:
    """A few thousand lines of real text shipped with the package (the bundled Cranfield sample)."""
    from embedlib.data import sample_corpus_texts

    return sample_corpus_texts()


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (Qwen-style special tokens) trained on ``texts``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        mask_token="<|mask|>",
        model_max_length=2048,
        padding_side="right",
    )
    return wrapped


def tiny_qwen3_config(vocab_size: int, **overrides) -> Qwen3Config:
    """A Qwen3 config a few hundred KB in size (shape knobs overridable)."""
    return Qwen3Config(**{"vocab_size": vocab_size, **TINY_QWEN3_SHAPE, **overrides})


def make_tiny_checkpoint(
    out_dir: str | os.PathLike,
    family: str = "qwen3-causal",
    texts: Iterable[str] | None = None,
    vocab_size: int = 2048,
    seed: int = 0,
    **config_overrides,
) -> Path:
    """Write a tiny random checkpoint folder and return its path.

    Families: ``qwen3-causal`` (a stock Qwen3-Base stand-in, ``Qwen3ForCausalLM``), ``qwen3-bidirectional``
    and ``pplx-embed`` (``model_type: bidirectional_pplx_qwen3``, base-model weights, sentence-transformers
    files, as the published pplx-embed-v1 checkpoints), ``bert`` (a BERT encoder).
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe_tokenizer(texts if texts is not None else bundled_text(), vocab_size)
    torch.manual_seed(seed)
    if family == "bert":
        config = BertConfig(
            vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
        )
        model = BertModel(config)
    else:
        # Like Qwen3-Base: no pad_token_id in the model config (so <|endoftext|> keeps a trained embedding
        # row); the tokenizer pads with <|endoftext|>.
        config = tiny_qwen3_config(len(tokenizer), eos_token_id=tokenizer.eos_token_id, **config_overrides)
        model = Qwen3ForCausalLM(config)
        if family != "qwen3-causal":
            encoder = BidirectionalQwen3Model(to_bidirectional_config(config))
            encoder.load_state_dict(model.model.state_dict())
            model = encoder
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if family == "pplx-embed":
        write_sentence_transformers_config(out, model.config.hidden_size, 512)
    return out
