"""LoRA adapters (peft) for the contrastive stages, merged into the base weights before saving."""

from __future__ import annotations

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model

from embedlib.training.config import LoraConfig


def add_lora(model: torch.nn.Module, cfg: LoraConfig) -> PeftModel:
    """Freeze ``model`` and add trainable LoRA adapters on ``cfg.target_modules`` (DiffEmbed: r=16, all projections)."""
    config = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=cfg.target_modules
    )
    return get_peft_model(model, config)


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model with any LoRA adapters folded into its weights (the model itself otherwise)."""
    if isinstance(model, PeftModel):
        return model.merge_and_unload()
    return model
