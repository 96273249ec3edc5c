"""The paper's ablation baseline, kept apart from the recipe: a causal decoder, next-token prediction and
last-token pooling (the pplx-embed ablation compares it with diffusion pretraining + bidirectional attention +
mean pooling). Nothing outside ablation runs imports this module's model loading.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoModelForCausalLM

from embedlib.models.loading import (
    Backbone,
    checkpoint_folder,
    checkpoint_max_length,
    load_tokenizer,
    read_checkpoint_config,
)


def load_causal_backbone(
    path_or_url: str | os.PathLike, with_lm_head: bool = False, max_length: int | None = None
) -> Backbone:
    """A stock (causal) decoder checkpoint as it is (``AutoModelForCausalLM`` or ``AutoModel``), pooled by its
    last token: ``Encoder(load_causal_backbone(...))`` is the ablation's encoder."""
    source = str(path_or_url)
    folder = checkpoint_folder(source)
    config = read_checkpoint_config(folder, source)
    model_cls = AutoModelForCausalLM if with_lm_head else AutoModel
    model = model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = load_tokenizer(folder)
    return Backbone(
        model=model.eval(),
        tokenizer=tokenizer,
        source=source,
        max_length=int(max_length or checkpoint_max_length(folder, tokenizer, config)),
        is_decoder=True,
        pooling="last_token",
    )


def next_token_loss(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, accuracy)`` of next-token prediction over real tokens."""
    targets = input_ids[:, 1:]
    valid = attention_mask[:, 1:].bool()
    shifted = logits[:, :-1].float()
    loss = F.cross_entropy(shifted[valid], targets[valid])
    with torch.no_grad():
        accuracy = (shifted[valid].argmax(dim=-1) == targets[valid]).float().mean()
    return loss, accuracy
