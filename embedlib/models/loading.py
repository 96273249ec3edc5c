"""Load backbones from Hugging Face checkpoint folders on local disk or any fsspec URL.

Decoder families (Qwen3, Qwen2, Llama, and the pplx-embed-v1 ``bidirectional_pplx_qwen3`` format) are
loaded as bidirectional encoders; anything else (BERT family) goes through ``AutoModel`` as it is.
Nothing is ever fetched from a model hub: a path that is not a complete checkpoint folder is an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from embedlib import storage
from embedlib.errors import UserError, storage_failures_as
from embedlib.models.bidirectional import BIDIRECTIONAL_FAMILIES, is_decoder_family, to_bidirectional_config

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "vocab.json")
DEFAULT_MAX_LENGTH = 512

class CheckpointError(UserError, FileNotFoundError):
    """A checkpoint folder that is missing or incomplete; the message names the path and what is wrong."""


class WrapsModel:
    """``device`` and ``dim`` (hidden size) of an object that holds a transformers ``model``."""

    model: PreTrainedModel

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)


@dataclass
class Backbone:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    max_length: int
    is_decoder: bool
    pooling: str = "mean"  # how the encoder pools token states (``embedlib.encoding.pooling``); saved in 1_Pooling
    # Subtracted before binary codes are taken (``embedlib.encoding.quantize``); saved in BINARY_CENTRE_FILE.
    binary_centre: np.ndarray | None = None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None`` means float32 on CPU and bfloat16 on GPU; strings like ``"bf16"`` are accepted."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}
    if dtype not in names:
        raise ValueError(f"dtype must be one of {sorted(names)}, got {dtype!r}")
    return names[dtype]


def checkpoint_folder(source: str) -> Path:
    """The local folder of the checkpoint at ``source`` (a download when remote); ``CheckpointError`` naming the
    (redacted) URL when it cannot be read."""
    with storage_failures_as(
        CheckpointError, source, missing="checkpoint folder does not exist", unreadable="cannot read the checkpoint"
    ):
        return storage.local_dir(source)


def read_checkpoint_config(folder: Path, source: str) -> dict:
    """The parsed ``config.json`` of a checkpoint folder, after checking weights and tokenizer are there."""
    where = storage.redact_url(source)
    if not folder.is_dir():
        raise CheckpointError(f"{where}: checkpoint folder does not exist")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{where}: missing config.json")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{where}: config.json is not valid JSON ({err})") from err
    if not isinstance(config, dict) or "model_type" not in config:
        raise CheckpointError(f"{where}: config.json has no 'model_type'")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise CheckpointError(f"{where}: missing weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{where}: missing tokenizer files (one of {', '.join(TOKENIZER_FILES)})")
    return config


def checkpoint_max_length(folder: Path, tokenizer: PreTrainedTokenizerBase, config: dict) -> int:
    """The sequence cap the checkpoint was trained with (sentence-transformers' value first)."""
    st_config = folder / "sentence_bert_config.json"
    if st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    positions = int(config.get("max_position_embeddings") or DEFAULT_MAX_LENGTH)
    if tokenizer.model_max_length and tokenizer.model_max_length < 1_000_000:
        return min(int(tokenizer.model_max_length), positions)
    return positions


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer, right-padded (positions of real tokens never shift) with a pad token."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "right"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_backbone(
    path_or_url: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    max_length: int | None = None,
    with_lm_head: bool = False,
) -> Backbone:
    """Load a checkpoint as an encoder (``with_lm_head``: keep the LM head, for diffusion training)."""
    source = str(path_or_url)
    folder = checkpoint_folder(source)
    config = read_checkpoint_config(folder, source)
    device = torch.device(device) if device is not None else default_device()
    torch_dtype = resolve_dtype(dtype, device)
    decoder = is_decoder_family(config["model_type"])
    if decoder:
        bidi_config = to_bidirectional_config(AutoConfig.from_pretrained(folder))
        family = next(f for f, (c, _, _) in BIDIRECTIONAL_FAMILIES.items() if isinstance(bidi_config, c))
        _, encoder_cls, lm_cls = BIDIRECTIONAL_FAMILIES[family]
        model_cls = lm_cls if with_lm_head else encoder_cls
        model = model_cls.from_pretrained(folder, config=bidi_config, dtype=torch_dtype, attn_implementation="sdpa")
    else:
        if with_lm_head:
            raise ValueError(
                f"{storage.redact_url(source)}: with_lm_head needs a decoder-family checkpoint, "
                f"got {config['model_type']!r}"
            )
        model = AutoModel.from_pretrained(folder, dtype=torch_dtype)
    model.to(device).eval()
    tokenizer = load_tokenizer(folder)
    return Backbone(
        model=model,
        tokenizer=tokenizer,
        source=source,
        max_length=int(max_length or checkpoint_max_length(folder, tokenizer, config)),
        is_decoder=decoder,
        pooling=read_pooling_mode(folder),
        binary_centre=read_binary_centre(folder, source, int(model.config.hidden_size)),
    )


def state_dict_hash(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes): identifies the weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


BINARY_CENTRE_FILE = "binary_centre.json"


def read_binary_centre(folder: Path, source: str, dim: int) -> np.ndarray | None:
    """The centre a checkpoint's ``binary_centre.json`` holds (float32 ``(dim,)``), or None where it has none."""
    path = folder / BINARY_CENTRE_FILE
    if not path.exists():
        return None
    where = f"{storage.redact_url(source)}: {BINARY_CENTRE_FILE}"
    try:
        centre = np.asarray(json.loads(path.read_text())["centre"], dtype=np.float32)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{where} is not valid ({err})") from err
    if centre.shape != (dim,) or not np.isfinite(centre).all():
        raise CheckpointError(f"{where}: 'centre' must be {dim} finite numbers (the hidden size), got shape "
                              f"{centre.shape}")
    return centre


def binary_centre_json(centre: np.ndarray, fitted_on: dict) -> str:
    """The contents of ``binary_centre.json``: the centre and what it was fitted on."""
    return json.dumps({"centre": [float(v) for v in centre], "fitted_on": fitted_on})


# sentence-transformers' Pooling config key of each pooling mode
POOLING_KEYS = {"mean": "pooling_mode_mean_tokens", "last_token": "pooling_mode_lasttoken"}


def read_pooling_mode(folder: Path) -> str:
    """The pooling mode a checkpoint's ``1_Pooling/config.json`` names (``mean`` where there is none)."""
    path = folder / "1_Pooling" / "config.json"
    if not path.is_file():
        return "mean"
    config = json.loads(path.read_text())
    return next((mode for mode, key in POOLING_KEYS.items() if config.get(key)), "mean")


def write_sentence_transformers_config(folder: Path, dim: int, max_length: int, pooling: str = "mean") -> None:
    """The sentence-transformers files for a Transformer + Pooling pipeline (no normalization)."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    pooling_config = {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        **{key: mode == pooling for mode, key in POOLING_KEYS.items()},
    }
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_length, "do_lower_case": False}, indent=2)
    )
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"similarity_fn_name": "cosine", "model_type": "SentenceTransformer"}, indent=2)
    )
