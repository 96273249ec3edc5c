"""Decoder LMs turned into bidirectional encoders (the pplx-embed recipe).

Stock transformers builds a causal mask for decoder models whatever the config says, so a bidirectional
model needs both halves: ``is_causal=False`` on every attention layer (used by SDPA/flash kernels when no
explicit mask is passed) and an explicit padding-only mask built with ``create_bidirectional_mask``.

The classes are registered with ``AutoConfig``/``AutoModel`` under their own ``model_type`` when this module is
imported (``Encoder`` and the model loaders import it), so checkpoints saved by embedlib (and the published
pplx-embed-v1 family, whose ``model_type`` is ``bidirectional_pplx_qwen3``) load with ``trust_remote_code`` off,
also through ``sentence_transformers`` once ``embedlib.models.bidirectional`` is imported.
"""

from __future__ import annotations

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Model,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3Model,
)
from transformers.masking_utils import create_bidirectional_mask


def disable_causal_attention(model: torch.nn.Module) -> int:
    """Set ``is_causal=False`` on every attention module; returns how many were changed."""
    changed = 0
    for module in model.modules():
        if getattr(module, "is_causal", None) is True:
            module.is_causal = False
            changed += 1
    return changed


def bidirectional_attention_mask(
    config, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor | None:
    """A padding-only mask in the format the configured attention implementation expects."""
    if attention_mask is None:
        attention_mask = torch.ones(inputs_embeds.shape[:2], dtype=torch.long, device=inputs_embeds.device)
    return create_bidirectional_mask(
        config=config,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        allow_is_bidirectional_skip=False,
    )


class BidirectionalMixin:
    """Mixed into a decoder base model or its ``*ForCausalLM`` (same weights and head): no causal mask, ever."""

    def __init__(self, config):
        super().__init__(config)
        disable_causal_attention(self)
        self.config.is_causal = False

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, **kwargs):
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        if attention_mask is None or attention_mask.ndim == 2:
            attention_mask = bidirectional_attention_mask(self.config, inputs_embeds, attention_mask)
        kwargs.setdefault("use_cache", False)
        return super().forward(inputs_embeds=inputs_embeds, attention_mask=attention_mask, **kwargs)


def bidirectional_family(name: str, model_type: str, config_base, model_base, lm_base) -> tuple[type, type, type]:
    """``Bidirectional<name>Config`` (registered as ``model_type``), ``...Model`` and ``...ForMaskedLM``."""

    def make(suffix: str, bases: tuple, attributes: dict) -> type:
        return type(f"Bidirectional{name}{suffix}", bases, {"__module__": __name__, **attributes})

    config_cls = make("Config", (config_base,), {"model_type": model_type})
    model_cls = make("Model", (BidirectionalMixin, model_base), {"config_class": config_cls})
    lm_cls = make("ForMaskedLM", (BidirectionalMixin, lm_base), {"config_class": config_cls})
    return config_cls, model_cls, lm_cls


# Qwen3 is pplx-embed's family (its published model_type); Qwen2 (Dream's family) and Llama (LLaDA's) follow.
BidirectionalQwen3Config, BidirectionalQwen3Model, BidirectionalQwen3ForMaskedLM = bidirectional_family(
    "Qwen3", "bidirectional_pplx_qwen3", Qwen3Config, Qwen3Model, Qwen3ForCausalLM
)
BidirectionalQwen2Config, BidirectionalQwen2Model, BidirectionalQwen2ForMaskedLM = bidirectional_family(
    "Qwen2", "bidirectional_qwen2", Qwen2Config, Qwen2Model, Qwen2ForCausalLM
)
BidirectionalLlamaConfig, BidirectionalLlamaModel, BidirectionalLlamaForMaskedLM = bidirectional_family(
    "Llama", "bidirectional_llama", LlamaConfig, LlamaModel, LlamaForCausalLM
)

# decoder model_type -> (bidirectional config class, encoder class, LM class)
BIDIRECTIONAL_FAMILIES = {
    "qwen3": (BidirectionalQwen3Config, BidirectionalQwen3Model, BidirectionalQwen3ForMaskedLM),
    "qwen2": (BidirectionalQwen2Config, BidirectionalQwen2Model, BidirectionalQwen2ForMaskedLM),
    "llama": (BidirectionalLlamaConfig, BidirectionalLlamaModel, BidirectionalLlamaForMaskedLM),
}
BIDIRECTIONAL_MODEL_TYPES = {cfg.model_type: base for base, (cfg, _, _) in BIDIRECTIONAL_FAMILIES.items()}


def _register() -> None:
    for config_cls, model_cls, lm_cls in BIDIRECTIONAL_FAMILIES.values():
        AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, model_cls, exist_ok=True)
        AutoModelForMaskedLM.register(config_cls, lm_cls, exist_ok=True)


_register()


def to_bidirectional_config(config):
    """The bidirectional config for a decoder config (``qwen3`` -> ``bidirectional_pplx_qwen3``, ...)."""
    if config.model_type in BIDIRECTIONAL_MODEL_TYPES:
        return config
    if config.model_type not in BIDIRECTIONAL_FAMILIES:
        raise ValueError(
            f"model_type {config.model_type!r} has no bidirectional variant; "
            f"supported: {sorted(BIDIRECTIONAL_FAMILIES)}"
        )
    config_cls = BIDIRECTIONAL_FAMILIES[config.model_type][0]
    fields = config.to_dict()
    fields.pop("model_type", None)
    fields["architectures"] = [BIDIRECTIONAL_FAMILIES[config.model_type][1].__name__]
    return config_cls(**fields)


def is_decoder_family(model_type: str) -> bool:
    return model_type in BIDIRECTIONAL_FAMILIES or model_type in BIDIRECTIONAL_MODEL_TYPES
