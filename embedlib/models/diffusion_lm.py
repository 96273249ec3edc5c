"""Diffusion language models WITH their LM head: Dream, LLaDA and embedlib's own diffusion-pretrained Qwen3.

Each format is mapped onto a stock transformers architecture made bidirectional (``bidirectional.py``), so
no ``trust_remote_code`` is needed:

- Dream (``model_type: "Dream"``): Qwen2 fields and Qwen2 weight names -> ``BidirectionalQwen2ForMaskedLM``.
  Dream is initialised from an autoregressive Qwen2.5 and keeps its shifted prediction: the logits at
  position ``i`` predict the token at ``i + 1`` (``logits_shift = 1``).
- LLaDA (``model_type: "llada"``, OLMo-style names ``model.transformer.blocks.N.ff_proj`` ...) ->
  ``BidirectionalLlamaForMaskedLM`` through a weight-name mapping; the position of a mask predicts itself.
- embedlib's own checkpoints (``bidirectional_pplx_qwen3`` etc. with an ``lm_head``) -> ``load_backbone``.

The mask token id comes from the checkpoint's config (``mask_token_id``), else from the tokenizer.
The module also loads causal LMs for the autoregressive PromptReps baseline; ``tiny_diffusion.py`` writes tiny
checkpoints in each on-disk format.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from embedlib import storage
from embedlib.models.bidirectional import (
    BidirectionalLlamaConfig,
    BidirectionalLlamaForMaskedLM,
    BidirectionalQwen2Config,
    BidirectionalQwen2ForMaskedLM,
    is_decoder_family,
)
from embedlib.models.loading import (
    CheckpointError,
    WrapsModel,
    checkpoint_folder,
    checkpoint_max_length,
    default_device,
    load_backbone,
    read_checkpoint_config,
    resolve_dtype,
)
from embedlib.models.mask_token import KNOWN_MASK_IDS, resolve_mask_id

LLADA_MASK_TOKEN_ID = KNOWN_MASK_IDS["llada"]
# Fields of a Dream config.json that are not Qwen2 architecture fields.
DREAM_ONLY_FIELDS = ("model_type", "architectures", "auto_map", "transformers_version")

# LLaDA (OLMo layout) weight names -> Llama weight names.
LLADA_KEY_MAPPING = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    r"^model\.transformer\.blocks\.(\d+)\.attn_norm\.": r"model.layers.\1.input_layernorm.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_norm\.": r"model.layers.\1.post_attention_layernorm.",
    r"^model\.transformer\.blocks\.(\d+)\.q_proj\.": r"model.layers.\1.self_attn.q_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.k_proj\.": r"model.layers.\1.self_attn.k_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.v_proj\.": r"model.layers.\1.self_attn.v_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.attn_out\.": r"model.layers.\1.self_attn.o_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_proj\.": r"model.layers.\1.mlp.gate_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.up_proj\.": r"model.layers.\1.mlp.up_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_out\.": r"model.layers.\1.mlp.down_proj.",
}
# LLaDA config values the Llama mapping reproduces exactly; anything else is refused, naming the field.
LLADA_REQUIRED = {
    "block_type": ("llama",),
    "layer_norm_type": ("rms",),
    "activation_type": ("silu", "swiglu"),
    "rope": (True,),
    "alibi": (False, None),
    "attention_layer_norm": (False, None),
    "input_emb_norm": (False, None),
    "scale_logits": (False, None),
    "include_bias": (False, None),
}


@dataclass
class DiffusionLM(WrapsModel):
    """A bidirectional LM with its head, and what is needed to read predictions at mask positions."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    mask_token_id: int
    logits_shift: int  # 1: position i predicts token i+1 (Dream); 0: a mask position predicts itself
    format: str
    source: str
    max_length: int
    source_config: dict = field(default_factory=dict)  # the checkpoint's config.json (saving keeps its format)


def detect_format(config: dict) -> str:
    """``dream``, ``llada`` or ``embedlib`` from a parsed ``config.json``; ``CheckpointError`` otherwise."""
    model_type = str(config.get("model_type", ""))
    if model_type.lower() == "dream":
        return "dream"
    if model_type.lower() == "llada":
        return "llada"
    if is_decoder_family(model_type):
        return "embedlib"
    raise CheckpointError(
        f"model_type {model_type!r} is not a diffusion LM format embedlib reads "
        f"(Dream, llada, or a decoder family: qwen3/qwen2/llama and their bidirectional variants)"
    )


def dream_config(fields: dict) -> BidirectionalQwen2Config:
    """A Dream ``config.json`` as the bidirectional Qwen2 config it is."""
    kept = {key: value for key, value in fields.items() if key not in DREAM_ONLY_FIELDS}
    return BidirectionalQwen2Config(**kept, architectures=["BidirectionalQwen2ForMaskedLM"])


def llada_config(fields: dict, source: str = "config.json") -> BidirectionalLlamaConfig:
    """A LLaDA ``config.json`` as a bidirectional Llama config; unsupported variants name the field."""
    for name, allowed in LLADA_REQUIRED.items():
        if name in fields and fields[name] not in allowed:
            raise CheckpointError(
                f"{source}: LLaDA field {name!r} = {fields[name]!r} is not supported (allowed: {allowed})"
            )
    for name in ("d_model", "n_heads", "n_layers"):
        if name not in fields:
            raise CheckpointError(f"{source}: LLaDA config has no {name!r}")
    d_model, n_heads = int(fields["d_model"]), int(fields["n_heads"])
    mlp = fields.get("mlp_hidden_size") or int(fields.get("mlp_ratio", 4)) * d_model
    return BidirectionalLlamaConfig(
        vocab_size=int(fields.get("embedding_size") or fields["vocab_size"]),
        hidden_size=d_model,
        intermediate_size=int(mlp),
        num_hidden_layers=int(fields["n_layers"]),
        num_attention_heads=n_heads,
        num_key_value_heads=int(fields.get("n_kv_heads") or n_heads),
        head_dim=d_model // n_heads,
        max_position_embeddings=int(fields.get("max_sequence_length", 4096)),
        rms_norm_eps=float(fields.get("rms_norm_eps", 1e-5)),
        rope_theta=float(fields.get("rope_theta", 10000.0)),
        attention_bias=bool(fields.get("include_qkv_bias") or False),
        mlp_bias=False,
        hidden_act="silu",
        tie_word_embeddings=bool(fields.get("weight_tying", False)),
        pad_token_id=fields.get("pad_token_id"),
        eos_token_id=fields.get("eos_token_id"),
        mask_token_id=fields.get("mask_token_id"),
        architectures=["BidirectionalLlamaForMaskedLM"],
    )


def load_lm_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer without remote code: a custom ``tokenizer_class`` (Dream's ``DreamTokenizer``)
    is read from ``tokenizer.json`` with the special tokens of ``tokenizer_config.json``."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (ValueError, OSError, KeyError, AttributeError) as err:
        if not (folder / "tokenizer.json").is_file():
            raise CheckpointError(
                f"{folder}: tokenizer needs remote code and there is no tokenizer.json"
            ) from err
        special = (
            json.loads((folder / "tokenizer_config.json").read_text())
            if (folder / "tokenizer_config.json").is_file()
            else {}
        )
        names = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"),
            **{name: special[name] for name in names if isinstance(special.get(name), str)},
        )
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_weights_strictly(model_cls, folder: Path, config, dtype: torch.dtype, source: str, **kwargs):
    """``from_pretrained`` that refuses a checkpoint whose weights do not all map onto the architecture."""
    model, info = model_cls.from_pretrained(
        folder, config=config, dtype=dtype, attn_implementation="sdpa", output_loading_info=True, **kwargs
    )
    missing = sorted(set(info.get("missing_keys", [])))
    unexpected = sorted(set(info.get("unexpected_keys", [])))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: weights do not match {model_cls.__name__}: missing {missing[:8]}, unexpected {unexpected[:8]}"
        )
    return model


def load_diffusion_lm(
    path_or_url: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_length: int | None = None,
    logits_shift: int | None = None,
) -> DiffusionLM:
    """Load a Dream, LLaDA or embedlib diffusion checkpoint (local path or fsspec URL) with its LM head.

    ``logits_shift`` overrides the format's default (Dream 1, LLaDA 0, embedlib: ``config.logits_shift`` or 0).
    """
    source = str(path_or_url)
    where = storage.redact_url(source)  # what messages show
    folder = checkpoint_folder(source)
    fields = read_checkpoint_config(folder, source)
    kind = detect_format(fields)
    device = torch.device(device) if device is not None else default_device()
    torch_dtype = resolve_dtype(dtype, device)
    if kind == "embedlib":
        backbone = load_backbone(
            source, device=device, dtype=torch_dtype, max_length=max_length, with_lm_head=True
        )
        model, tokenizer = backbone.model, backbone.tokenizer
        default_shift = int(fields.get("logits_shift", 0))
    else:
        tokenizer = load_lm_tokenizer(folder)
        if kind == "dream":
            model = load_weights_strictly(
                BidirectionalQwen2ForMaskedLM, folder, dream_config(fields), torch_dtype, where
            )
            default_shift = 1
        else:
            model = load_weights_strictly(
                BidirectionalLlamaForMaskedLM,
                folder,
                llada_config(fields, where),
                torch_dtype,
                where,
                key_mapping=LLADA_KEY_MAPPING,
            )
            default_shift = 0
        model.to(device).eval()
    try:
        mask_token_id = resolve_mask_id(tokenizer, config=fields, vocab_size=model.config.vocab_size)
    except ValueError as error:
        raise CheckpointError(f"{where}: {error}") from None
    return DiffusionLM(
        model=model,
        tokenizer=tokenizer,
        mask_token_id=mask_token_id,
        logits_shift=default_shift if logits_shift is None else int(logits_shift),
        format=kind,
        source=source,
        max_length=int(max_length or checkpoint_max_length(folder, tokenizer, fields)),
        source_config=fields,
    )


def load_causal_lm(
    path_or_url: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A stock causal LM and its left-padded tokenizer (the autoregressive PromptReps baseline)."""
    source = str(path_or_url)
    folder = checkpoint_folder(source)
    fields = read_checkpoint_config(folder, source)
    if fields["model_type"] not in ("qwen3", "qwen2", "llama"):
        raise CheckpointError(
            f"{storage.redact_url(source)}: the autoregressive baseline needs a causal qwen3/qwen2/llama checkpoint, "
            f"got model_type {fields['model_type']!r}"
        )
    device = torch.device(device) if device is not None else default_device()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=resolve_dtype(dtype, device))
    model.to(device).eval()
    tokenizer = load_lm_tokenizer(folder)
    tokenizer.padding_side = "left"
    return model, tokenizer


# --- saving in the loaded format -------------------------------------------------------------------------

# Llama weight names -> LLaDA (OLMo layout) names, applied in order: the inverse of LLADA_KEY_MAPPING.
LLADA_INVERSE_NAMES = {
    "model.embed_tokens.": "model.transformer.wte.",
    "model.norm.": "model.transformer.ln_f.",
    "lm_head.": "model.transformer.ff_out.",
    "input_layernorm.": "attn_norm.",
    "post_attention_layernorm.": "ff_norm.",
    "self_attn.o_proj.": "attn_out.",
    "self_attn.": "",
    "mlp.gate_proj.": "ff_proj.",
    "mlp.up_proj.": "up_proj.",
    "mlp.down_proj.": "ff_out.",
    "model.layers.": "model.transformer.blocks.",
}
# Remote-code fields of a checkpoint's tokenizer_config.json that saving restores.
REMOTE_TOKENIZER_FIELDS = ("tokenizer_class", "auto_map")


def llada_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Llama state dict under LLaDA's weight names (contiguous tensors, ready for safetensors)."""
    renamed = {}
    for name, tensor in state_dict.items():
        for old, new in LLADA_INVERSE_NAMES.items():
            name = name.replace(old, new)
        renamed[name] = tensor.detach().contiguous()
    return renamed


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def llada_fields(config, mask_token_id: int) -> dict:
    """A LLaDA ``config.json`` describing the Llama architecture ``config`` (what :func:`llada_config` reads)."""
    return {
        "model_type": "llada",
        "d_model": config.hidden_size,
        "n_heads": config.num_attention_heads,
        "n_kv_heads": config.num_key_value_heads,
        "n_layers": config.num_hidden_layers,
        "mlp_hidden_size": config.intermediate_size,
        "activation_type": "silu",
        "block_type": "llama",
        "layer_norm_type": "rms",
        "rms_norm_eps": config.rms_norm_eps,
        "rope": True,
        "rope_theta": _rope_theta(config),
        "alibi": False,
        "attention_layer_norm": False,
        "input_emb_norm": False,
        "scale_logits": False,
        "include_bias": False,
        "include_qkv_bias": bool(config.attention_bias),
        "weight_tying": bool(config.tie_word_embeddings),
        "max_sequence_length": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "embedding_size": config.vocab_size,
        "mask_token_id": mask_token_id,
        "use_cache": False,
    }


def _lm_config_fields(lm: DiffusionLM, folder: Path) -> dict:
    """Write the weights of ``lm`` to ``folder`` in its format; returns the ``config.json`` fields to write."""
    model = lm.model
    if lm.format == "llada":
        weights = llada_state_dict(model.state_dict())
        if model.config.tie_word_embeddings:
            weights.pop("model.transformer.ff_out.weight", None)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        ids = {k: getattr(model.config, k, None) for k in ("pad_token_id", "eos_token_id")}
        fields = {**lm.source_config, **{k: v for k, v in ids.items() if v is not None}}
        return {**fields, **llada_fields(model.config, lm.mask_token_id)}
    model.save_pretrained(folder, safe_serialization=True)
    fields = json.loads((folder / "config.json").read_text())
    fields["mask_token_id"] = lm.mask_token_id
    if lm.format == "dream":
        fields = {k: v for k, v in fields.items() if k not in DREAM_ONLY_FIELDS}
        kept = {k: v for k, v in lm.source_config.items() if k in DREAM_ONLY_FIELDS}
        return {**fields, "model_type": "Dream", **kept}
    return {**fields, "logits_shift": lm.logits_shift}


def _copy_remote_code(source: str, folder: Path) -> None:
    """The source checkpoint's remote-code files and tokenizer class, so other readers load it as before."""
    if not storage.is_local(source):
        return
    origin = Path(storage.strip_file_scheme(source))
    for code in origin.glob("*.py"):
        shutil.copy2(code, folder / code.name)
    source_tokenizer, saved_tokenizer = origin / "tokenizer_config.json", folder / "tokenizer_config.json"
    if source_tokenizer.is_file() and saved_tokenizer.is_file():
        original = json.loads(source_tokenizer.read_text())
        saved = json.loads(saved_tokenizer.read_text())
        saved.update({k: original[k] for k in REMOTE_TOKENIZER_FIELDS if k in original})
        saved_tokenizer.write_text(json.dumps(saved, indent=2))


def _save_lm_local(lm: DiffusionLM, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fields = _lm_config_fields(lm, folder)
    (folder / "config.json").write_text(json.dumps(fields, indent=2))
    lm.tokenizer.save_pretrained(folder)
    if lm.format != "embedlib":
        _copy_remote_code(lm.source, folder)


def save_diffusion_lm(lm: DiffusionLM, path_or_url: str | os.PathLike) -> None:
    """Write ``lm`` with its LM head in the format it was loaded from (Dream, LLaDA or embedlib), mask token id
    in ``config.json``, so :func:`load_diffusion_lm` reads it back the same (local path or fsspec URL)."""
    if storage.is_local(path_or_url):
        _save_lm_local(lm, Path(storage.strip_file_scheme(path_or_url)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        _save_lm_local(lm, Path(tmp))
        storage.upload_dir(tmp, path_or_url)
