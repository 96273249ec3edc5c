"""The encode step: checked input rows -> staging parts, streamed through a Ray Data encoder actor pool.

Each input row comes out once, in a parquet part under the run's staging folder (``PART_COLUMNS``):
- rejected rows with their reason and no vector;
- rows whose ``(id, content_hash)`` the previous version holds: its stored vectors, carried over by a join;
- the rest: encoded by the method's encoder in the actors (one model per actor), ``encoded`` set.

Parts are written atomically, each by the task that made it, so a killed run leaves only whole parts; the next
run over the same input anti-joins them away by ``(source, line)`` and encodes only what is left. A part is named
by its rows (``part_name``), so a batch retried after its actor or node was lost rewrites its own part; every
encoding attempt leaves a claim (``claim``), from which the build counts the documents encoded more than once.
The driver sees per-part counts only.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from embedlib.encoding.formats import embedded_text
from embedlib.index.config import IndexJobConfig
from embedlib.index.methods import index_method
from embedlib.index.parts import (
    SPAN_TYPES,
    EncodeSettings,
    claim,
    part_name,
    part_rows,
    part_schema,
    rows_meta,
    write_part,
)


class EncodeActor:
    """One model per actor: encodes a batch's rows that have no vector yet and writes the batch as one part.

    Writing in the actor keeps vectors out of the object store and makes a part of every batch (Ray Data
    would otherwise coalesce the actor's output into large blocks before a separate writer saw them).
    """

    def __init__(
        self,
        settings: EncodeSettings,
        folder: str,
        rejects_folder: str,
        claims_folder: str,
        torch_threads: int | None,
        device: str | None,
        dtype: str | None,
    ):
        import torch  # in the actor only: the driver that builds the pipeline stays torch-free

        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.settings = settings
        self.method = index_method(settings.method)
        self.encoder = self.method.load_encoder(settings.model, settings.cfg, device, dtype)
        self.schema = part_schema(settings.types)
        self.folder, self.rejects_folder, self.claims_folder = folder, rejects_folder, claims_folder

    def __call__(self, batch: pa.Table) -> pa.Table:
        """Rows of one batch -> one staging part; returns the part's counts (one row)."""
        name = part_name(batch)
        return write_part(self.part(batch, name), self.folder, self.rejects_folder, name)

    def part(self, batch: pa.Table, name: str) -> pa.Table:
        valid = pc.equal(batch.column("reason"), "").to_numpy(zero_copy_only=False)
        if "vector" in batch.column_names:
            has_vector = pc.is_valid(batch.column("vector")).to_numpy(zero_copy_only=False)
        else:
            has_vector = np.zeros(batch.num_rows, bool)
        attempt = self.settings.attempt
        parts = []
        rejected = np.flatnonzero(~valid)
        if rejected.size:
            parts.append(part_rows(self.schema, rows_meta(batch, rejected), {}, {}, False, attempt))
        carried = np.flatnonzero(valid & has_vector)
        if carried.size:
            picked = batch.take(pa.array(carried, pa.int64()))
            spans = {name: picked.column(name).to_numpy(zero_copy_only=False) for name in SPAN_TYPES}
            stored = {name: picked.column(name).combine_chunks() for name in self.settings.types}
            parts.append(part_rows(self.schema, rows_meta(batch, carried), spans, stored, False, attempt))
        todo = np.flatnonzero(valid & ~has_vector)
        if todo.size:
            claim(self.claims_folder, name, todo.size)
            picked = batch.take(pa.array(todo, pa.int64()))
            titles, bodies = picked.column("title").to_pylist(), picked.column("text").to_pylist()
            texts = [embedded_text(title or "", text) for title, text in zip(titles, bodies, strict=True)]
            docs = self.encode(texts)
            spans = {"chunk": docs.chunk, "start": docs.start, "end": docs.end, "tokens": docs.tokens}
            parts.append(part_rows(self.schema, rows_meta(batch, todo[docs.owner]), spans, docs.columns, True, attempt))
        if not parts:
            return self.schema.empty_table()
        return pa.concat_tables(parts)

    def encode(self, texts: list[str]):
        """The method's index rows for ``texts`` (no autograd)."""
        import torch

        with torch.inference_mode():
            return self.method.encode(self.encoder, texts, self.settings.cfg, self.settings.types)


def default_torch_threads(cfg: IndexJobConfig) -> int:
    """Cores per actor when not configured: the node's cores shared by the actors."""
    return cfg.torch_threads or max(1, (os.cpu_count() or 1) // cfg.actors)


def encode_to_parts(
    rows: ray.data.Dataset, settings: EncodeSettings, folder: str, rejects_folder: str, claims_folder: str
) -> ray.data.Dataset:
    """Rows -> encoder actor pool -> staging parts under ``folder``; the result holds per-part counts.

    Fault tolerance is set here, not left to Ray Data's defaults (actors restarted forever, so a pool whose
    actors cannot come back waits forever): an actor lost with its process or node is restarted up to
    ``max_actor_restarts`` times, and its batches are retried up to ``max_task_retries`` times; an error raised
    by the encoder itself is not retried (a bug or a bad model fails once, not five times).
    """
    cfg = settings.cfg
    return rows.map_batches(
        EncodeActor,
        batch_format="pyarrow",
        batch_size=cfg.batch_rows,
        compute=ray.data.ActorPoolStrategy(size=cfg.actors, max_tasks_in_flight_per_actor=2),
        num_cpus=cfg.cpus_per_actor,
        num_gpus=cfg.gpus_per_actor,
        resources=cfg.actor_resources,
        max_restarts=cfg.max_actor_restarts,
        max_task_retries=cfg.max_task_retries,
        fn_constructor_kwargs=dict(
            settings=settings,
            folder=folder,
            rejects_folder=rejects_folder,
            claims_folder=claims_folder,
            torch_threads=None if cfg.gpus_per_actor else default_torch_threads(cfg),
            device=cfg.device,
            dtype=cfg.dtype,
        ),
    )
