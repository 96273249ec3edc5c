"""The diffusion mask token: one resolver for training configs and for loading diffusion checkpoints."""

from __future__ import annotations

from collections.abc import Mapping

# Mask ids of the published diffusion LMs, accepted by name in configs.
KNOWN_MASK_IDS = {"dream": 151666, "llada": 126336}


def resolve_mask_id(
    tokenizer,
    requested: int | str | None = None,
    config: Mapping | None = None,
    vocab_size: int | None = None,
) -> int:
    """The mask token id: ``requested`` (an id or a known family's name), else the checkpoint config's
    ``mask_token_id`` (Dream, LLaDA), else the tokenizer's mask token; it must lie inside the vocabulary
    (``vocab_size``: the model's embedding rows, which may outnumber the tokenizer's tokens)."""
    if isinstance(requested, str):
        if requested not in KNOWN_MASK_IDS:
            raise ValueError(f"mask_id: unknown model family {requested!r}; known: {sorted(KNOWN_MASK_IDS)}")
        requested = KNOWN_MASK_IDS[requested]
    if requested is None and config is not None:
        requested = config.get("mask_token_id")
    if requested is None:
        requested = tokenizer.mask_token_id
    if requested is None:
        raise ValueError(
            "mask_id: no mask_token_id in the checkpoint config and the tokenizer has no mask token; "
            "set mask_id to a rarely used token id"
        )
    size = vocab_size or len(tokenizer)
    if not 0 <= int(requested) < size:
        raise ValueError(f"mask_id: {requested} is outside the vocabulary (size {size})")
    return int(requested)
