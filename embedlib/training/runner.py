"""The training runner: Ray Train ``TorchTrainer`` workers driving a DeepSpeed engine (gloo on CPU, NCCL on GPU).

Checkpoints (DeepSpeed state of every rank + step and metrics history) go to ``checkpoint_url`` through Ray
Train's storage; a restarted worker group (``FailureConfig``) or a rerun with the same ``run_name`` resumes
from the latest one, continuing the step count and the data position. A NaN/inf loss stops every worker
before anything is checkpointed, and the driver raises :class:`TrainingDiverged`.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from embedlib import storage
from embedlib.training.config import TrainConfig, from_dict, to_dict

STATE_FILE = "trainer_state.json"
# ``after_step(metrics, rank)``: called on every worker after each optimizer step (and after that step's
# checkpoint, if any) with the step's metrics (``step``, ``loss``, ``resumed_from_step`` in a resumed attempt).
# Production runs pass none; tests inject faults with it.
StepHook = Callable[[dict, int], None]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; nothing past the last good checkpoint was written."""


@dataclass
class TrainResult:
    output: str  # the saved model (Encoder.from_pretrained loads it)
    steps: int
    history: list[dict]  # one row per logged step
    checkpoint: str | None  # the latest checkpoint folder (Ray Train storage)


# --- optimisation --------------------------------------------------------------------------------------------


def total_steps(cfg: TrainConfig, rows: int) -> int:
    """Optimizer steps of the run: ``max_steps``, else ``epochs`` over the rows every worker can consume."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    per_step = cfg.batch_size * cfg.scaling.num_workers * cfg.deepspeed.gradient_accumulation_steps
    return max(1, cfg.epochs * (rows // per_step))


def lr_lambda(cfg: TrainConfig, steps: int):
    """The learning-rate multiplier per step: linear warmup, then cosine / linear decay or constant."""
    warmup, schedule = cfg.optimizer.warmup_steps, cfg.optimizer.schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor


def deepspeed_config(cfg: TrainConfig) -> dict:
    """The DeepSpeed config (ZeRO stage, precision, accumulation, clipping) from the training config."""
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.deepspeed.gradient_accumulation_steps,
        "gradient_clipping": cfg.optimizer.grad_clip,
        "zero_optimization": {"stage": cfg.deepspeed.zero_stage},
        "bf16": {"enabled": cfg.deepspeed.precision == "bf16"},
        # The optimizer is torch's AdamW, passed in: no JIT-compiled fused/CPU Adam kernel is needed.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def make_engine(module: torch.nn.Module, cfg: TrainConfig, steps: int):
    """A DeepSpeed engine over ``module`` with AdamW and the configured schedule."""
    import deepspeed

    parameters = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        parameters, lr=cfg.optimizer.lr, betas=cfg.optimizer.betas, weight_decay=cfg.optimizer.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, steps))
    engine, _, _, _ = deepspeed.initialize(
        model=module, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(cfg)
    )
    from embedlib.training.safe_checkpoint import use_weights_only_loading

    use_weights_only_loading(engine)  # resuming never unpickles code from the checkpoint location
    return engine


def to_device(batch, device: torch.device):
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch.to(device) if isinstance(batch, torch.Tensor) else batch


def count_tokens(batch) -> int:
    """Real (non-padding) tokens in a collated batch."""
    if isinstance(batch, dict):
        if "attention_mask" in batch:
            return int(batch["attention_mask"].sum())
        return sum(count_tokens(v) for v in batch.values())
    return 0


# --- the worker loop -------------------------------------------------------------------------------------------


def restore(engine, checkpoint) -> tuple[int, list[dict]]:
    """Load a Ray Train checkpoint into ``engine``; returns ``(step, history)``.

    Files are read with ``weights_only=True`` (``make_engine``): one holding anything but tensors and plain data
    is refused with ``UnsafeCheckpointError``, naming it at the checkpoint's own location.
    """
    from embedlib.training.safe_checkpoint import UnsafeCheckpointError

    with checkpoint.as_directory() as folder:
        try:
            engine.load_checkpoint(folder, tag="state", load_module_strict=False)
        except UnsafeCheckpointError as err:  # name the file where it is stored, not in a temporary download
            raise UnsafeCheckpointError(str(err).replace(str(folder), storage.redact_url(checkpoint.path), 1)) from None
        state = json.loads((Path(folder) / STATE_FILE).read_text())
    return int(state["step"]), state["history"]


def save_checkpoint(engine, step: int, history: list[dict], metrics: dict, rank: int, upload: str) -> None:
    """Every rank writes its DeepSpeed shard; rank 0 adds the step and history; Ray Train persists them.

    ``upload="async"``: Ray Train copies the folder to storage in the background and deletes it afterwards,
    so the step loop does not wait for the upload; ``"sync"``: ``report`` returns once it is stored.
    """
    import ray.train

    folder = tempfile.mkdtemp(prefix=f"embedlib-ckpt-{step}-")
    try:
        # Frozen parameters (the forgetting guard's copy of the starting model, LoRA's base weights) are rebuilt
        # from the starting model on resume: saving them would double an anchored run's checkpoints.
        engine.save_checkpoint(folder, tag="state", exclude_frozen_parameters=True)
        if rank == 0:
            (Path(folder) / STATE_FILE).write_text(json.dumps({"step": step, "history": history}))
        mode = ray.train.CheckpointUploadMode.ASYNC if upload == "async" else ray.train.CheckpointUploadMode.SYNC
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(folder),
            checkpoint_upload_mode=mode,
            delete_local_checkpoint_after_upload=True,
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def micro_batches(shard, cfg: TrainConfig, skip: int):
    """Micro-batches (dicts of columns) for epoch after epoch, skipping the first ``skip`` (resumption)."""
    seen = 0
    epoch = 0
    while True:
        for rows in shard.iter_batches(batch_size=cfg.batch_size, batch_format="numpy", drop_last=True):
            if seen >= skip:
                yield epoch, {k: v.tolist() for k, v in rows.items()}
            seen += 1
        epoch += 1


def all_ranks_mean(value: float) -> float:
    import torch.distributed as dist

    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor) / dist.get_world_size()


def worker_loop(config: dict) -> None:
    """Ray Train's per-worker function: one DeepSpeed data-parallel rank."""
    import ray.train

    from embedlib.training.stages import build_stage

    cfg: TrainConfig = from_dict(TrainConfig, config["train"])
    steps: int = config["steps"]
    after_step: StepHook | None = config.get("after_step")
    context = ray.train.get_context()
    rank = context.get_world_rank()
    # One thread per worker unless told: on a shared or oversubscribed CPU, extra threads spin and slow down.
    torch.set_num_threads(cfg.scaling.torch_threads or 1)
    torch.manual_seed(cfg.seed)
    parts = build_stage(cfg, seed=cfg.seed + rank)
    device = torch.device("cuda", context.get_local_rank()) if cfg.scaling.use_gpu else torch.device("cpu")
    parts.module.to(device)
    engine = make_engine(parts.module, cfg, steps)
    step, history = 0, []
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        step, history = restore(engine, checkpoint)
    resumed_from = step if checkpoint is not None else None
    accumulation = cfg.deepspeed.gradient_accumulation_steps
    batches = micro_batches(ray.train.get_dataset_shard("train"), cfg, skip=step * accumulation)
    tokens, started, metrics = 0, time.perf_counter(), {}
    step_started = started
    while step < steps:
        epoch, rows = next(batches)
        if hasattr(parts.module, "progress"):
            parts.module.progress = step / steps
        batch = to_device(parts.collate(rows), device)
        tokens += count_tokens(batch)
        out = engine(batch) if "input_ids" not in batch else engine(**batch)
        loss = all_ranks_mean(float(out["loss"].detach()))
        if not math.isfinite(loss):
            message = f"loss is {loss} at step {step + 1} (epoch {epoch}): stopping before any checkpoint is written"
            if context.get_world_rank() == 0:  # every rank sees the same all-reduced loss and stops here
                storage.write_bytes_atomic(divergence_marker(cfg), message.encode())
            return
        engine.backward(out["loss"])
        engine.step()
        if not engine.is_gradient_accumulation_boundary():
            continue
        step += 1
        now = time.perf_counter()
        elapsed = now - started
        metrics = {
            "step": step,
            "epoch": epoch,
            "loss": loss,
            "lr": engine.get_lr()[0],
            "tokens_per_s": all_ranks_mean(tokens / elapsed) * context.get_world_size(),
            # wall time since the previous step ended, including that step's checkpoint save/upload
            "step_seconds": now - step_started,
        }
        step_started = now
        if resumed_from is not None:
            metrics["resumed_from_step"] = resumed_from
        if "accuracy" in out:
            metrics["masked_accuracy" if not cfg.causal else "next_token_accuracy"] = all_ranks_mean(
                float(out["accuracy"])
            )
        for name in sorted(k for k in out if k.endswith("_loss")):  # parts of the loss (diffretriever)
            metrics[name] = all_ranks_mean(float(out[name]))
        tokens, started = 0, time.perf_counter()
        history.append(metrics)
        if rank == 0 and step % cfg.log_every == 0:
            print(progress_line(metrics, steps), flush=True)
        if step % cfg.checkpoint_every == 0 or step == steps:
            save_checkpoint(engine, step, history, metrics, rank, cfg.checkpoint_upload)
        elif cfg.report_every and step % cfg.report_every == 0:
            ray.train.report(metrics)
        if after_step is not None:
            after_step(metrics, rank)
    with whole_parameters(parts.module, cfg):
        if rank == 0:
            save_trained_model(parts, cfg)


def progress_line(metrics: dict, steps: int) -> str:
    """``step 12/300 epoch 0 loss 3.21 lr 1.000e-03 tokens_per_s 5120 ...``: every metric, for the run's log."""
    parts = [f"step {metrics['step']}/{steps}", f"epoch {metrics['epoch']}"]
    for name, value in metrics.items():
        if name not in ("step", "epoch"):
            parts.append(f"{name} {value:.3e}" if name == "lr" else f"{name} {value:.4g}")
    return " ".join(parts)


def whole_parameters(module: torch.nn.Module, cfg: TrainConfig):
    """A context in which the module's parameters are whole: ZeRO-3 partitions them across ranks, and
    gathering them is a collective that every rank enters."""
    if cfg.deepspeed.zero_stage != 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)


def save_trained_model(parts, cfg: TrainConfig) -> None:
    """Write the model so ``Encoder.from_pretrained`` loads it (LoRA merged; the LM head kept when pretraining);
    diffretriever: so ``DiffRetrieverEncoder.from_pretrained`` does (LM head, mask id and format kept)."""
    from embedlib.encoding.encoder import Encoder
    from embedlib.training.centre import fit_binary_centre
    from embedlib.training.lora import merged
    from embedlib.training.recipe import write_recipe

    write_recipe(cfg.output, cfg)
    if cfg.stage == "diffretriever":
        parts.module.trained_encoder().save_pretrained(cfg.output)
        return
    encoder = parts.encoder
    model = merged(encoder.model)
    model.eval()
    saved = Encoder(
        type(encoder.backbone)(
            model=model,
            tokenizer=encoder.tokenizer,
            source=encoder.source,
            max_length=encoder.max_length,
            is_decoder=encoder.backbone.is_decoder,
        )
    )
    saved.save_pretrained(cfg.output)
    if cfg.binary_centre_docs:  # loads the saved model: no DeepSpeed (ZeRO-3) hooks in a rank-0 forward pass
        fit_binary_centre(cfg.output, cfg.data.url, cfg.binary_centre_docs, cfg.seed, cfg.data.format)


# --- the driver ----------------------------------------------------------------------------------------------------


def checkpoint_url(cfg: TrainConfig) -> str:
    """Where the run's checkpoints go: ``checkpoint_url``, else a folder beside ``output``."""
    return cfg.checkpoint_url or cfg.output.rstrip("/") + "-checkpoints"


def divergence_marker(cfg: TrainConfig) -> str:
    """Where a worker that saw a NaN/inf loss leaves its message for the driver (Ray Train V2 surfaces only
    metrics reported with a checkpoint, and a diverged run must not write one)."""
    return storage.join(checkpoint_url(cfg), cfg.run_name, "DIVERGED")


def run_storage(cfg: TrainConfig) -> tuple[str, object]:
    """Ray Train ``storage_path`` and ``storage_filesystem`` for ``checkpoint_url`` (local or any fsspec URL)."""
    url = checkpoint_url(cfg)
    if storage.is_local(url):
        path = Path(storage.strip_file_scheme(url)).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return str(path), None
    from embedlib.training.data import arrow_filesystem

    filesystem, path = arrow_filesystem(url)
    return path, filesystem


def train(
    cfg: TrainConfig, dataset=None, after_step: StepHook | None = None, callbacks: Sequence = ()
) -> TrainResult:
    """Run a training stage on Ray Train + DeepSpeed; returns where the model went and the metric history.

    ``after_step`` runs on the workers after every step and ``callbacks`` (``ray.train.UserCallback``) on the
    Ray Train controller: hooks for tests and tools; a production run passes neither.
    """
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from embedlib.training.data import read_dataset, row_format
    from embedlib.training.plots import write_history

    if dataset is None:
        rows = row_format(cfg.stage, cfg.hard_negatives)
        dataset = read_dataset(cfg.data.url, rows, cfg.data.format, stream=cfg.data.stream)
    steps = total_steps(cfg, dataset.count())
    storage_path, filesystem = run_storage(cfg)
    marker = divergence_marker(cfg)
    if storage.exists(marker):  # left by an earlier run of the same name
        fs, path = storage.filesystem(marker)
        fs.rm(path)
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config={"train": to_dict(cfg), "steps": steps, "after_step": after_step},
        torch_config=TorchConfig(backend="nccl" if cfg.scaling.use_gpu else "gloo"),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.scaling.num_workers,
            use_gpu=cfg.scaling.use_gpu,
            resources_per_worker={
                "CPU": cfg.scaling.cpus_per_worker,
                **({"GPU": 1} if cfg.scaling.use_gpu else {}),
            },
            placement_strategy=cfg.scaling.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=cfg.run_name,
            storage_path=storage_path,
            storage_filesystem=filesystem,
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            callbacks=list(callbacks),
            worker_runtime_env={"env_vars": {"OMP_NUM_THREADS": str(cfg.scaling.torch_threads or 1)}},
        ),
        datasets={"train": dataset},
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    if storage.exists(marker):
        raise TrainingDiverged(f"{cfg.run_name}: {storage.read_bytes(marker).decode()}")
    history = load_history(result.checkpoint)
    write_history(history, cfg.output, title=f"{cfg.stage}: {cfg.run_name}")
    return TrainResult(
        output=cfg.output,
        steps=history[-1]["step"] if history else 0,
        history=history,
        checkpoint=result.checkpoint.path if result.checkpoint else None,
    )


def load_history(checkpoint) -> list[dict]:
    if checkpoint is None:
        return []
    with checkpoint.as_directory() as folder:
        return json.loads((Path(folder) / STATE_FILE).read_text())["history"]
