"""DeepSpeed checkpoints read with ``torch.load(weights_only=True)``: loading a checkpoint never runs code.

DeepSpeed's own checkpoint engine (``TorchCheckpointEngine``) unpickles every file with ``weights_only=False``
and has no option to do otherwise, so a model-states or optimizer file planted at the checkpoint location would
run whatever it holds when a run resumes. ``use_weights_only_loading`` swaps in an engine that reads tensors and
plain data only, plus the few DeepSpeed types its checkpoints legitimately hold (``CHECKPOINT_TYPES``, found by
saving real ZeRO-0..3 fp32/bf16 checkpoints and listing them with
``torch.serialization.get_unsafe_globals_in_checkpoint``); anything else is refused, naming the file.
"""

from __future__ import annotations

import pickle
import re

import torch
from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

# ZeRO optimizer states hold the loss scaler, the ZeRO stage and (ZeRO 1/2) parameter fragment addresses.
CHECKPOINT_TYPES = [LossScaler, ZeroStageEnum, fragment_address]


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file that holds more than tensors and plain data; it was not loaded. The message names it."""


class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's torch checkpoint engine, loading with ``weights_only=True`` (saving is unchanged)."""

    def load(self, path: str, map_location=None):
        with torch.serialization.safe_globals(CHECKPOINT_TYPES):
            try:
                return torch.load(path, map_location=map_location, weights_only=True)
            except pickle.UnpicklingError as err:
                raise UnsafeCheckpointError(
                    f"{path}: not loaded: it holds {refused_global(err)}, not only tensors and plain data (a "
                    "checkpoint that would run code when read may have been tampered with)"
                ) from None  # torch's own message suggests weights_only=False, which is what must not happen


def refused_global(err: pickle.UnpicklingError) -> str:
    """The name of what ``weights_only`` loading refused (``builtins.open``, say), from torch's message."""
    found = re.search(r"GLOBAL (\S+)", str(err))
    return found.group(1) if found else str(err).splitlines()[0]


def use_weights_only_loading(engine) -> None:
    """Make a DeepSpeed engine read every checkpoint file with ``weights_only=True`` (``WeightsOnlyCheckpointEngine``)."""
    if type(engine.checkpoint_engine) is not TorchCheckpointEngine:  # another engine: its semantics would be lost
        raise TypeError(f"expected DeepSpeed's TorchCheckpointEngine, got {type(engine.checkpoint_engine).__name__}")
    engine.checkpoint_engine = WeightsOnlyCheckpointEngine(engine._config)
