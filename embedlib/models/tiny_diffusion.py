"""Tiny random checkpoints in the real on-disk formats of diffusion LMs (Dream, LLaDA, embedlib's own), for tests
and benches: what ``embedlib.models.diffusion_lm`` loads, written without downloading anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from embedlib.models.bidirectional import BidirectionalQwen3ForMaskedLM, to_bidirectional_config
from embedlib.models.diffusion_lm import LLADA_MASK_TOKEN_ID, llada_fields, llada_state_dict
from embedlib.models.tiny import bundled_text, tiny_qwen3_config, train_bpe_tokenizer


def tiny_decoder_fields(hidden_size: int, num_hidden_layers: int, num_key_value_heads: int) -> dict:
    """The architecture fields every tiny decoder here shares (4 heads, MLP twice the width, untied head)."""
    return dict(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=4, num_key_value_heads=num_key_value_heads, max_position_embeddings=2048,
        tie_word_embeddings=False,
    )



def _tiny_tokenizer(vocab_size: int, tokenizer: PreTrainedTokenizerFast | None) -> PreTrainedTokenizerFast:
    """The given tokenizer (to share one between checkpoints), else a BPE trained on the bundled text."""
    return tokenizer if tokenizer is not None else train_bpe_tokenizer(bundled_text(), vocab_size)


def make_tiny_dream_checkpoint(
    out_dir: str | os.PathLike,
    vocab_size: int = 2048,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> Path:
    """A random tiny checkpoint in Dream's format: Qwen2 weights, ``model_type: "Dream"``, ``auto_map`` to
    remote code, a ``DreamTokenizer`` tokenizer class, and the mask id in ``config.json``."""
    out = Path(out_dir)
    tokenizer = _tiny_tokenizer(vocab_size, tokenizer)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **tiny_decoder_fields(hidden_size, num_hidden_layers, num_key_value_heads=2),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    fields = json.loads((out / "config.json").read_text())
    fields.update(
        model_type="Dream",
        architectures=["DreamModel"],
        auto_map={"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        mask_token_id=tokenizer.mask_token_id,
    )
    (out / "config.json").write_text(json.dumps(fields, indent=2))
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config.update(
        tokenizer_class="DreamTokenizer",
        auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
    )
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return out


def make_tiny_llada_checkpoint(
    out_dir: str | os.PathLike,
    vocab_size: int = 2048,
    seed: int = 0,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    mask_token_id: int = LLADA_MASK_TOKEN_ID,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> Path:
    """A random tiny checkpoint in LLaDA's format: OLMo-style weight names in two safetensors shards with an
    index, ``model_type: "llada"``, and LLaDA's embedding size so its real mask id (126336) is in range."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tiny_tokenizer(vocab_size, tokenizer)
    embedding_size = max(len(tokenizer), ((mask_token_id + 1 + 127) // 128) * 128)
    torch.manual_seed(seed)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=embedding_size,
            **tiny_decoder_fields(hidden_size, num_hidden_layers, num_key_value_heads=4),
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
        )
    )
    names = llada_state_dict(llama.state_dict())
    keys = sorted(names)
    shards = {
        "model-00001-of-00002.safetensors": keys[: len(keys) // 2],
        "model-00002-of-00002.safetensors": keys[len(keys) // 2 :],
    }
    for file, part in shards.items():
        save_file({key: names[key] for key in part}, str(out / file), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {key: file for file, part in shards.items() for key in part}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    fields = {
        "architectures": ["LLaDAModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        },
        **llada_fields(llama.config, mask_token_id),
        "mlp_ratio": 4,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    (out / "config.json").write_text(json.dumps(fields, indent=2))
    tokenizer.save_pretrained(out)
    return out


def make_tiny_diffusion_qwen3_checkpoint(
    out_dir: str | os.PathLike,
    vocab_size: int = 2048,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
    **config_overrides,
) -> Path:
    """A random tiny checkpoint as embedlib's diffusion pretraining saves it: ``BidirectionalQwen3ForMaskedLM``
    (``model_type: bidirectional_pplx_qwen3``) with its LM head and a ``<|mask|>`` token."""
    out = Path(out_dir)
    tokenizer = _tiny_tokenizer(vocab_size, tokenizer)
    torch.manual_seed(seed)
    config = tiny_qwen3_config(
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **config_overrides,
    )
    model = BidirectionalQwen3ForMaskedLM(to_bidirectional_config(config))
    model.config.architectures = ["BidirectionalQwen3ForMaskedLM"]
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


TINY_WRITERS = {
    "dream": make_tiny_dream_checkpoint,
    "llada": make_tiny_llada_checkpoint,
    "embedlib": make_tiny_diffusion_qwen3_checkpoint,
}
