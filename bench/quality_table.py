"""Issue 13: the retrieval-quality table. Base all-MiniLM-L6-v2 against each fine-tuning recipe on SciFact test,
NFCorpus test, Cranfield, CISI and the held-out Quora split, in float, INT8 and binary through the exact
FAISS paths the index serves (cosine on INT8 codes, Hamming on packed bits).

    python bench/quality_table.py                        # train what is missing, sweep the merge, evaluate all
    python bench/quality_table.py --rows base,multi-3ep      # only these rows (measured rows are kept)
    python bench/quality_table.py --previous bench/results/quality_table.json   # keep an earlier run's rows
    python bench/quality_table.py --eval-max-length 256 --rows base,multi-anchor-3ep   # quality_table-len256.*
    python bench/quality_table.py --eval-max-length 256 --previous bench/results/quality_table-len256.json \
        --rows multi-anchor-3ep-doc256-lr1e4 --remeasure multi-anchor-3ep-doc256-lr1e4   # one row again, keep the rest

Rows (names: ``multi`` the four-source mixture of SciFact train, NFCorpus dev, Quora train groups and Gutenberg
spans, ``single`` SciFact train alone; ``anchor`` the forgetting guard at ``anchor_weight`` 10, none otherwise;
``2ep`` / ``3ep`` epochs of 48 steps, 1 otherwise; ``lr1e4`` learning rate 1e-4, 5e-5 otherwise; ``-merged``
SLERP-merged with the base, the weight swept on held-out dev queries against 300 documents a set: the one closest
to the base that keeps half of the best dev gain, ``-merged-keep90`` 90% of it, ``-merged-keep90-dev2000`` 90% on
2,000 documents a set and a finer grid, ``-merged-guard`` that weight capped before a guard set of domains never
trained on (Quora's training groups, wikitext-2 test spans) first scores below the base, ``-merged-lines``
keep90-dev2000 with the merge scaled by depth, layer i of L moving t·i/(L - 1) and the embeddings kept (LiNeS)):
- ``base``: the model as shipped;
- ``multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90-dev2000`` (recommended): what the shipped configs
  make, jobs/configs/minilm-general.yaml (SciFact train and NFCorpus dev, 256-token training documents, binary term
  on; the row without ``-merged-keep90-dev2000``) merged by jobs/configs/minilm-general-merge.yaml; ``-seed1`` and
  ``-seed2`` the same with other training seeds; ``-merged-keep90`` by the 300-document rule shipped before;
  ``-soup3`` the equal-weight average of seeds 0, 1 and 2 (a model soup), and its merge;
  ``-noquora-wikitext`` with wikitext-2 spans added; ``-replay`` with wikitext-2 spans as an anchor-only source
  (replay: their batches only hold the model to the base's embeddings), merged by keep90-dev2000, its
  ``-seed1`` and ``-seed2``, and the soup of the three (``-replay-soup3``) and its merge;
- ``multi-anchor-3ep-doc256-lr1e4``: the four-source mixture (the previous recommendation), its ``-merged`` and
  ``-seed1``;
- ``multi-anchor-3ep-doc256``: that at lr 5e-5 (the recommendation before), with its ``-merged``,
  ``-seed1`` and ``-seed2``;
- ``multi-anchor-3ep``: the same on 96-token documents (every row below trains on 96), and its ablations:
  ``-merged`` (swept likewise), ``-nobinary`` without the binary term, ``single-anchor-3ep`` on SciFact train
  alone, ``multi-3ep`` without the anchor, ``-seed1`` and ``-seed2`` with other seeds (mixture sample and
  initialisation), for the run-to-run spread;
- ``multi-anchor``, ``multi-anchor-2ep``: 1 and 2 epochs; ``single-anchor``; ``multi-anchor-w30``: weight 30;
- the 1-epoch recipes without the anchor: ``multi``, ``multi-merged`` and ``single-merged`` (each swept),
  ``single``, ``multi-nobinary``, ``multi-nobinary-merged`` (at ``multi-merged``'s weight), ``multi-nfnegtop``
  (NFCorpus's BM25 negatives from the top of the ranking), ``multi-lora`` (LoRA r 16 on every linear layer,
  lr 5e-4, folded in when saved).

Binary is what the index serves for the model: ``sign(x)`` codes by Hamming distance, or, for a model saved with a
binary centre ``c`` (training's ``binary_centre_docs``: the recommended config and its seeds; the merge config's,
fitted on the fine-tuned model's training rows: merged rows made since), ``sign(x - c)`` codes scored against
float queries ``x - c``; each row records its ``binary_code``.

Training runs in this process (``bench/train_common.plain_loop``: the same stage module and optimiser as the
Ray Train runner, which ``jobs/train.py`` drives with the same YAML). Every model's float embeddings of each
corpus are encoded once and cached by weights hash (``--cache``); INT8 and binary are derived from them. Each
measured row is saved under ``--work`` (per evaluation length) so an interrupted run resumes; the table is written
from every measured row: ``bench/results/quality_table.{json,md,png}`` (+ the merge curve PNG), or
``quality_table-len<N>.*`` when evaluated at another ``--eval-max-length`` than 128 (256 is MiniLM's own length
and the issue's: base SciFact 0.6487 there). Rows measured since keep their per-query INT8 scores; where the base
and the recommended row both have them, the acceptance adds each set's change with its paired-bootstrap 95%
interval (``int8_change_vs_base_ci95``): how large a change query sampling alone could make.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "jobs"))

import merge as merge_job  # noqa: E402
from eval_common import EVAL_CACHE  # noqa: E402
from result_file import RESULTS, Result  # noqa: E402
from train import prepare_mixture  # noqa: E402
from train_common import plain_loop  # noqa: E402

from embedlib.config import from_dict  # noqa: E402
from embedlib.data import default_model_path, resolve_model  # noqa: E402
from embedlib.eval.beir import BeirDataset, load_beir, read_records  # noqa: E402
from embedlib.eval.metrics import paired_bootstrap  # noqa: E402
from embedlib.eval.report import figure_png  # noqa: E402
from embedlib.eval.run import evaluate_systems  # noqa: E402
from embedlib.eval.systems import DenseSystem, ModelEmbeddings  # noqa: E402
from embedlib.models.loading import BINARY_CENTRE_FILE  # noqa: E402
from embedlib.training.config import MergeConfig, SourceConfig, TrainConfig, load_config, load_merge_config  # noqa: E402
from embedlib.training.mixture import heldout_dataset  # noqa: E402
from embedlib.training.plots import write_history  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
CONFIG = ROOT / "jobs" / "configs" / "minilm-general.yaml"
MERGE_CONFIG = ROOT / "jobs" / "configs" / "minilm-general-merge.yaml"
QUANTIZATIONS = ("float", "int8", "binary")
# the shipped configs' model: the training config, then the merge config (both checked at start)
RECOMMENDED = "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90-dev2000"
DEFAULT_EVAL_MAX_LENGTH = 128
WORK = "/tmp/embedlib-bench/quality"  # --work: trained models and measured rows
ROWS = (
    "base", "multi-anchor-3ep-doc256-lr1e4", "multi-anchor-3ep-doc256-lr1e4-seed1",
    "multi-anchor-3ep-doc256-lr1e4-merged", "multi-anchor-3ep-doc256-lr1e4-noquora-wikitext",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-soup3",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-soup3-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-guard",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-guard",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-guard",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-lines",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-lines",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-lines",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed1-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed2-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-soup3",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-soup3-merged-keep90-dev2000",
    "multi-anchor-3ep-doc256", "multi-anchor-3ep-doc256-merged", "multi-anchor-3ep",
    "multi-anchor-3ep-merged", "multi-anchor-3ep-nobinary", "single-anchor-3ep", "multi-3ep",
    "multi-anchor-3ep-seed1", "multi-anchor-3ep-seed2",
    "multi-anchor-3ep-doc256-seed1", "multi-anchor-3ep-doc256-seed2",
    "multi-anchor", "multi-anchor-2ep", "single-anchor", "multi-anchor-w30",
    "multi", "multi-merged", "single", "single-merged", "multi-nobinary", "multi-nobinary-merged",
    "multi-nfnegtop", "multi-lora",
)
# Merged rows ("<fine-tuned row>-merged[-<rule>]") whose weight is swept on dev, each with its rule: the weight
# grid, the dev corpus size per set (``dev_max_docs``) and the keep_gain that chooses from the curve (the smallest
# weight keeping that share of the best dev gain). The other merged rows take WEIGHT_FROM's chosen weight.
# keep90 was fixed before its rows' test figures were measured, after seed 0's hand-picked t = 0.7 one-off
# (README); seed 1 tested it on a model nobody had looked at. keep90-dev2000 is the same rule on a 2,000-document
# dev corpus and a finer grid (300-document dev curves wobbled by as much as the rule decides on), fixed before
# any of its rows' test figures; seed 2 tests both rules on a model nobody had looked at.
DEV300 = {"sweep": [0.0, 0.25, 0.5, 0.75, 1.0], "dev_max_docs": 300}
DEV2000 = {"sweep": [0.0, 0.25, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0], "dev_max_docs": 2000}
KEEP50, KEEP90 = {"keep_gain": 0.5} | DEV300, {"keep_gain": 0.9} | DEV300
KEEP90_DEV2000 = {"keep_gain": 0.9} | DEV2000
# keep90-dev2000 capped by guard sets of domains never trained on, dev data that is neither trained on nor a test set:
# Quora's training groups (the evaluation split stays unseen) and wikitext-2 test spans (no row trains on them). The
# weight stops before any guard set first falls below the base's score (tolerance 0: the bar, asked of dev
# data). Fixed with its tolerance before any guard score was seen.
GUARD_SOURCES = [
    {"name": "quora-trained", "kind": "q2q", "url": "../shared/data/quora-q2q", "split": "test", "holdout": 0.5},
    {"name": "wikitext-test", "kind": "spans", "url": "../shared/data/text/wikitext2.test.tokens", "max_pairs": 1000},
]
GUARDED = KEEP90_DEV2000 | {"guard": GUARD_SOURCES, "guard_tolerance": 0.0}
# keep90-dev2000 with depth-scaled merging (LiNeS, Wang et al. 2024): layer i of L moves t·i/(L - 1), the embeddings
# stay at the base, so the shallow layers' general features are kept and the gain comes from the deep ones. Fixed
# before any of its dev or test scores was seen.
LINES = KEEP90_DEV2000 | {"layer_scaling": "linear"}
SWEPT = {"multi-anchor-3ep-doc256-lr1e4-merged": KEEP50, "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged": KEEP50,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90": KEEP90,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90": KEEP90,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90": KEEP90,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-soup3-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-guard": GUARDED,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-guard": GUARDED,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-guard": GUARDED,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-lines": LINES,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-lines": LINES,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-lines": LINES,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed1-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed2-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-soup3-merged-keep90-dev2000": KEEP90_DEV2000,
         "multi-anchor-3ep-doc256-merged": KEEP50, "multi-anchor-3ep-merged": KEEP50,
         "multi-merged": KEEP50, "single-merged": KEEP50}
WEIGHT_FROM = "multi-merged"
# Model soups (Wortsman et al. 2022): the equal-weight average of fine-tuned rows' weights, which keeps what the
# seeds share and averages out what each run drew by chance; a soup's merged rows merge it like one model.
SOUPS = {"multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-soup3": [
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1",
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2"],
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-soup3": [
        "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay",
        "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed1",
        "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed2"]}
# The four-source mixture every trained row starts from, whatever the shipped config mixes (``multi``: these
# four; a row's "sources" keeps some of them by name). Quora's held-out half is the table's Quora evaluation set.
FOUR_SOURCES = [
    {"name": "scifact", "kind": "beir", "url": "../shared/data/scifact", "split": "train", "weight": 0.5,
     "holdout": 0.2},
    {"name": "nfcorpus", "kind": "beir", "url": "../shared/data/nfcorpus-dev", "split": "dev", "weight": 0.2,
     "holdout": 0.2, "min_relevance": 2, "max_pairs": 2000, "negatives_skip_top": 20},
    {"name": "quora", "kind": "q2q", "url": "../shared/data/quora-q2q", "split": "test", "weight": 0.15,
     "holdout": 0.5},
    {"name": "text", "kind": "spans", "url": "../shared/data/text/gutenberg", "weight": 0.15, "max_pairs": 2000},
]
QUORA_HELDOUT = SourceConfig(**FOUR_SOURCES[2])
# Replay against forgetting (``-replay``): wikitext-2 validation spans (encyclopedic, science and technology
# included; not a guard set) as an anchor-only source, whose batches only hold the model to the base's embeddings of
# general text. Its share (7 : 1.75) and 1,920 rows leave the 1,536 training rows of SciFact + NFCorpus as they are.
# Fixed before any of its dev or test scores was seen.
REPLAY_SOURCE = {"name": "replay", "kind": "spans", "url": "../shared/data/text/wikitext2.valid.tokens",
                 "weight": 0.175, "max_pairs": 2000, "loss": "anchor"}
# Trained rows: overrides of the shipped config ("sources": the names of FOUR_SOURCES kept; "source_fields":
# fields set on one source; "added_sources": sources beyond FOUR_SOURCES). Each names its document length, learning
# rate, anchor weight and epochs so that it means the same whatever ships; only the doc256 rows train on 256-token
# documents, only lr1e4 ones at lr 1e-4.
DOC96, LR5E5 = {"data.max_length": 96}, {"optimizer.lr": 5.0e-5}
ANCHORED_3EP = {"anchor_weight": 10.0, "epochs": 3} | DOC96 | LR5E5
DOC256, LR1E4 = {"data.max_length": 256}, {"optimizer.lr": 1.0e-4}
ONE_EPOCH, NO_ANCHOR = {"epochs": 1} | DOC96 | LR5E5, {"anchor_weight": 0.0}
REPLAYED = ({"sources": ["scifact", "nfcorpus"], "added_sources": [REPLAY_SOURCE], "data.rows": 1920}
            | ANCHORED_3EP | DOC256 | LR1E4)
RECIPES = {
    "multi-anchor-3ep-doc256-lr1e4": ANCHORED_3EP | DOC256 | LR1E4,
    "multi-anchor-3ep-doc256-lr1e4-seed1": {"seed": 1} | ANCHORED_3EP | DOC256 | LR1E4,
    # no Quora pairs, and the spans from wikitext-2 (encyclopedic) instead of Gutenberg's books
    "multi-anchor-3ep-doc256-lr1e4-noquora-wikitext": {
        "sources": ["scifact", "nfcorpus", "text"],
        "source_fields": {"text": {"url": "../shared/data/text/wikitext2.valid.tokens"}},
    } | ANCHORED_3EP | DOC256 | LR1E4,
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus": {"sources": ["scifact", "nfcorpus"]} | ANCHORED_3EP | DOC256 | LR1E4,
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1": {"seed": 1, "sources": ["scifact", "nfcorpus"]}
    | ANCHORED_3EP | DOC256 | LR1E4,
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2": {"seed": 2, "sources": ["scifact", "nfcorpus"]}
    | ANCHORED_3EP | DOC256 | LR1E4,
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay": REPLAYED,
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed1": {"seed": 1} | REPLAYED,
    "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed2": {"seed": 2} | REPLAYED,
    "multi-anchor-3ep-doc256": ANCHORED_3EP | DOC256,  # training documents as long as evaluated
    "multi-anchor-3ep-doc256-seed1": {"seed": 1} | ANCHORED_3EP | DOC256,
    "multi-anchor-3ep-doc256-seed2": {"seed": 2} | ANCHORED_3EP | DOC256,
    "multi-anchor-3ep": ANCHORED_3EP,
    "multi-anchor-3ep-nobinary": {"binary_weight": 0.0} | ANCHORED_3EP,
    "single-anchor-3ep": {"sources": ["scifact"]} | ANCHORED_3EP,
    "multi-3ep": {"epochs": 3} | DOC96 | LR5E5 | NO_ANCHOR,
    "multi-anchor-3ep-seed1": {"seed": 1} | ANCHORED_3EP,  # another mixture sample and initialisation
    "multi-anchor-3ep-seed2": {"seed": 2} | ANCHORED_3EP,
    "multi-anchor": {"anchor_weight": 10.0} | ONE_EPOCH,
    "multi-anchor-2ep": {"anchor_weight": 10.0, "epochs": 2} | DOC96 | LR5E5,
    "single-anchor": {"sources": ["scifact"], "anchor_weight": 10.0} | ONE_EPOCH,
    "multi-anchor-w30": {"anchor_weight": 30.0} | ONE_EPOCH,
    "multi": ONE_EPOCH | NO_ANCHOR,
    "single": {"sources": ["scifact"]} | ONE_EPOCH | NO_ANCHOR,
    "multi-nobinary": {"binary_weight": 0.0} | ONE_EPOCH | NO_ANCHOR,
    "multi-nfnegtop": {"source_fields": {"nfcorpus": {"negatives_skip_top": 0}}} | ONE_EPOCH | NO_ANCHOR,
    "multi-lora": ONE_EPOCH | NO_ANCHOR | {"lora": {"r": 16, "alpha": 32}, "optimizer.lr": 5.0e-4},
}
# (what, without, with): the first six explain the recommended row; the rest are the recipes before it.
ABLATIONS = [
    ("without vs with merge kept 90% of the dev gain on 2,000-document dev sets (SciFact + NFCorpus)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus", RECOMMENDED),
    ("four sources (+ Quora pairs, Gutenberg spans) vs SciFact + NFCorpus (anchored, 256 tokens, lr 1e-4)",
     "multi-anchor-3ep-doc256-lr1e4", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus"),
    ("lr 5e-5 vs 1e-4 (anchored, 256 tokens)", "multi-anchor-3ep-doc256", "multi-anchor-3ep-doc256-lr1e4"),
    ("single- vs multi-source (anchored)", "single-anchor-3ep", "multi-anchor-3ep"),
    ("without vs with binary term (anchored)", "multi-anchor-3ep-nobinary", "multi-anchor-3ep"),
    ("without vs with the anchor", "multi-3ep", "multi-anchor-3ep"),
    ("96- vs 256-token training documents (anchored)", "multi-anchor-3ep", "multi-anchor-3ep-doc256"),
    ("without vs with merge (anchored, 256 tokens, lr 1e-4)", "multi-anchor-3ep-doc256-lr1e4",
     "multi-anchor-3ep-doc256-lr1e4-merged"),
    ("without vs with merge (anchored)", "multi-anchor-3ep", "multi-anchor-3ep-merged"),
    ("seed 0 vs 1: the run-to-run spread", "multi-anchor-3ep", "multi-anchor-3ep-seed1"),
    ("seed 0 vs 2: the run-to-run spread", "multi-anchor-3ep", "multi-anchor-3ep-seed2"),
    ("seed 0 vs 1 (256 tokens, lr 1e-4): the run-to-run spread", "multi-anchor-3ep-doc256-lr1e4",
     "multi-anchor-3ep-doc256-lr1e4-seed1"),
    ("without vs with wikitext spans (SciFact + NFCorpus, no Quora; 256 tokens, lr 1e-4)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus", "multi-anchor-3ep-doc256-lr1e4-noquora-wikitext"),
    ("without vs with merge (SciFact + NFCorpus; 256 tokens, lr 1e-4)", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged"),
    ("merge weight kept 50% vs 90% of the dev gain (SciFact + NFCorpus)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90"),
    ("seed 0 vs 1 (SciFact + NFCorpus; 256 tokens, lr 1e-4): the run-to-run spread",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1"),
    ("without vs with merge kept 90% of the dev gain (SciFact + NFCorpus, seed 1)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90"),
    ("keep 90% of the dev gain on 300- vs 2,000-document dev sets (SciFact + NFCorpus)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90", RECOMMENDED),
    ("keep 90% of the dev gain on 300- vs 2,000-document dev sets (SciFact + NFCorpus, seed 1)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90-dev2000"),
    ("seed 0 vs 2 (SciFact + NFCorpus; 256 tokens, lr 1e-4): the run-to-run spread",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2"),
    ("without vs with merge kept 90% of the dev gain on 2,000-document dev sets (SciFact + NFCorpus, seed 2)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90-dev2000"),
    ("one model vs the soup of seeds 0, 1, 2 (SciFact + NFCorpus; 256 tokens, lr 1e-4)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-soup3"),
    ("one model vs the soup of seeds 0, 1, 2, each merged by keep90-dev2000", RECOMMENDED,
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-soup3-merged-keep90-dev2000"),
    ("keep90-dev2000 without vs with the guard sets (SciFact + NFCorpus)", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-keep90-dev2000",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-guard"),
    ("keep90-dev2000 without vs with the guard sets (SciFact + NFCorpus, seed 1)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90-dev2000", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-guard"),
    ("keep90-dev2000 without vs with the guard sets (SciFact + NFCorpus, seed 2)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90-dev2000", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-guard"),
    ("keep90-dev2000 merged uniformly vs by depth (LiNeS; SciFact + NFCorpus)", RECOMMENDED,
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-merged-lines"),
    ("keep90-dev2000 merged uniformly vs by depth (LiNeS; SciFact + NFCorpus, seed 1)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90-dev2000", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-lines"),
    ("keep90-dev2000 merged uniformly vs by depth (LiNeS; SciFact + NFCorpus, seed 2)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90-dev2000", "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-lines"),
    ("without vs with general-text replay (anchor-only wikitext-2 spans; SciFact + NFCorpus, merged by keep90-dev2000)",
     RECOMMENDED, "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-merged-keep90-dev2000"),
    ("without vs with general-text replay (seed 1, merged by keep90-dev2000)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed1-merged-keep90-dev2000",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed1-merged-keep90-dev2000"),
    ("without vs with general-text replay (seed 2, merged by keep90-dev2000)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90-dev2000",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-seed2-merged-keep90-dev2000"),
    ("the soup of seeds 0, 1, 2 without vs with general-text replay, each merged by keep90-dev2000",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-soup3-merged-keep90-dev2000",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-replay-soup3-merged-keep90-dev2000"),
    ("keep 90% of the dev gain on 300- vs 2,000-document dev sets (SciFact + NFCorpus, seed 2)",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90",
     "multi-anchor-3ep-doc256-lr1e4-scifact-nfcorpus-seed2-merged-keep90-dev2000"),
    ("without vs with merge (anchored, 256 tokens)", "multi-anchor-3ep-doc256", "multi-anchor-3ep-doc256-merged"),
    ("seed 0 vs 1 (256 tokens): the run-to-run spread", "multi-anchor-3ep-doc256", "multi-anchor-3ep-doc256-seed1"),
    ("seed 0 vs 2 (256 tokens): the run-to-run spread", "multi-anchor-3ep-doc256", "multi-anchor-3ep-doc256-seed2"),
    ("1 vs 3 epochs (anchored)", "multi-anchor", "multi-anchor-3ep"),
    ("without vs with the anchor (1 epoch)", "multi", "multi-anchor"),
    ("single- vs multi-source (1 epoch, anchored)", "single-anchor", "multi-anchor"),
    ("single- vs multi-source (1 epoch)", "single", "multi"),
    ("without vs with merge (1 epoch)", "multi", "multi-merged"),
    ("single- vs multi-source (1 epoch, merged)", "single-merged", "multi-merged"),
    ("without vs with merge (1 epoch, single-source)", "single", "single-merged"),
    ("without vs with binary term (1 epoch)", "multi-nobinary", "multi"),
    ("without vs with binary term (1 epoch, merged)", "multi-nobinary-merged", "multi-merged"),
    ("NFCorpus negatives from BM25's top vs 20 places down (1 epoch)", "multi-nfnegtop", "multi"),
    ("full fine-tuning vs LoRA (1 epoch)", "multi", "multi-lora"),
]
PLOTTED = ("base", *dict.fromkeys(name for _, a, b in ABLATIONS[:6] for name in (a, b)))  # the PNG's rows


def eval_sets(quora: BeirDataset) -> dict[str, tuple[BeirDataset, bool]]:
    """The five evaluation sets: name -> (dataset, is Q2Q). Quora: the held-out duplicate groups only."""
    sets = {name: (load_beir(str(DATA / name), "test"), False) for name in ("scifact", "nfcorpus-test", "cranfield", "cisi")}
    sets["quora-heldout"] = (quora, True)
    return sets


CENTRED_BINARY_CODE, SIGN_BINARY_CODE = "sign(x - c) codes, float queries x - c", "sign(x) codes, Hamming"


def binary_code(path: str) -> str:
    """How the model's binary column is served: ``sign(x)`` and Hamming, or centred codes and float queries."""
    return CENTRED_BINARY_CODE if (Path(path) / BINARY_CENTRE_FILE).exists() else SIGN_BINARY_CODE


def evaluate_model(name: str, path: str, sets: dict, args) -> dict:
    """``{set: {"metric", "float", "int8", "binary"}}``: one encoding per corpus, three quantized searches."""
    torch.set_num_threads(args.torch_threads)
    model = ModelEmbeddings.load(name, path, cache=args.cache, max_length=args.eval_max_length)
    row = {}
    for set_name, (dataset, q2q) in sets.items():
        metric = "recall@10" if q2q else "ndcg@10"
        systems = [DenseSystem(model, q) for q in QUANTIZATIONS]
        results = evaluate_systems(dataset, systems, q2q=q2q, max_k=100)
        by_quantization = dict(zip(QUANTIZATIONS, results, strict=True))
        row[set_name] = {"metric": metric, **{q: r.metrics[metric] for q, r in by_quantization.items()},
                         "int8_per_query": {qid: round(v[metric], 6) for qid, v in by_quantization["int8"].per_query.items()}}
        print(f"{name} {set_name}: " + " ".join(f"{q} {row[set_name][q]:.4f}" for q in QUANTIZATIONS), flush=True)
    return row


def row_config(row: str, overrides: dict | None = None) -> TrainConfig:
    """The shipped config with the row's recipe (and ``overrides``) applied, its sources taken from FOUR_SOURCES
    (those the recipe keeps, with its field changes) and those it adds."""
    recipe = dict(RECIPES[row])
    kept = recipe.pop("sources", None)
    source_fields = recipe.pop("source_fields", {})
    sources = [source | source_fields.get(source["name"], {}) for source in FOUR_SOURCES
               if not kept or source["name"] in kept] + recipe.pop("added_sources", [])
    return load_config(str(CONFIG), {"data.sources": sources} | (overrides or {}) | recipe)


def recipe_config(row: str, work: Path, args) -> TrainConfig:
    """The row's config, writing under ``work``."""
    overrides = {
        "output": str(work / row),
        "data.url": str(work / f"{row}.parquet"),
        "run_name": f"quality-{row}",
        "scaling.torch_threads": args.torch_threads,
    }
    if args.steps:
        overrides["max_steps"] = args.steps
    cfg = row_config(row, overrides)
    cfg.model = resolve_model(cfg.model)
    return cfg


def train_row(row: str, work: Path, args) -> dict:
    """Train a recipe row (unless its model is saved under ``work``); its steps and wall time."""
    cfg = recipe_config(row, work, args)
    info = work / f"{row}-train.json"
    if info.exists():
        return json.loads(info.read_text())
    started = time.time()
    prepare_mixture(cfg)
    rows = read_records(cfg.data.url)
    history = plain_loop(cfg, rows)
    write_history(history, cfg.output, title=f"{row}: {cfg.run_name}")
    summary = {"steps": len(history), "wall_s": round(time.time() - started, 1), "final_loss": history[-1]["loss"],
               "rows": len(rows), "config": str(CONFIG.relative_to(ROOT)),
               "overrides": RECIPES[row]}
    info.write_text(json.dumps(summary, indent=1))
    return summary


def merge_row(work: Path, second: str, output: str, centre_rows: str | None, rule: dict | None = None,
              t: float | None = None, first: str | None = None, method: str | None = None) -> dict:
    """Merge ``second`` with the base (or ``first``) through ``jobs/merge.py``, as the merge config does but for the
    weight: with a SWEPT ``rule``, a sweep on the config's dev sets choosing by it; otherwise the weight ``t``. The
    merged model's binary centre is fitted on ``centre_rows`` (the fine-tuned model's training rows; None: none)."""
    cfg = load_merge_config(str(MERGE_CONFIG))
    values = {"first": first or cfg.first, "second": second, "output": output, "method": method or cfg.method,
              "max_length": cfg.max_length, "quantization": cfg.quantization, "cache": cfg.cache}
    if cfg.binary_centre_docs and centre_rows:
        values |= {"binary_centre_docs": cfg.binary_centre_docs, "binary_centre_data": centre_rows}
    sweep = rule is not None
    if sweep:
        values |= rule | {"dev": [{k: getattr(s, k) for k in ("name", "kind", "url", "split", "holdout", "seed")} for s in cfg.dev]}
    else:
        values["t"] = t
    path = work / f"merge-{Path(output).name}.json"
    path.write_text(json.dumps(values))
    if merge_job.main(["--config", str(path)]):
        raise SystemExit(f"merge failed: {path}")
    if not sweep:
        return {"chosen_t": t}
    report = json.loads((Path(output) / "merge_sweep.json").read_text())
    for point in report["curve"]:
        point.pop("guard_per_query", None)  # thousands of scores a point; the model's merge_sweep.json keeps them
    return report


def merged_source(row: str) -> str:
    """The fine-tuned row a merged row starts from: its name up to ``-merged``."""
    return row.split("-merged")[0]


def training_rows(row: str, work: Path) -> str:
    """The pair/triplet rows a fine-tuned row trained on (a soup: its first model's), to fit a binary centre on."""
    return f"{work / SOUPS.get(row, [row])[0]}.parquet"


def soup_row(row: str, work: Path, args) -> dict:
    """SOUPS[row]'s models averaged with equal weights: successive linear merges, the i-th model at t = 1/i."""
    paths = [model_path(name, work, args)[0] for name in SOUPS[row]]
    soup = paths[0]
    for i, path in enumerate(paths[1:], start=2):
        last = i == len(paths)
        output = str(work / row) if last else f"{work / row}-partial{i}"  # never the folder it reads
        merge_row(work, path, output, training_rows(row, work) if last else None, t=1 / i, first=soup,
                  method="linear")
        soup = output
    for i in range(2, len(paths)):
        shutil.rmtree(f"{work / row}-partial{i}", ignore_errors=True)
    return {"soup_of": SOUPS[row], "method": "linear"}


def model_path(row: str, work: Path, args) -> tuple[str, dict]:
    """The row's model folder (training or merging it first when missing) and how it was made."""
    if row == "base":
        return str(default_model_path()), {}
    if row in RECIPES:
        return str(work / row), train_row(row, work, args)
    if row in SOUPS:
        made = work / f"{row}-soup.json"
        if not made.exists():
            made.write_text(json.dumps(soup_row(row, work, args), indent=1))
        return str(work / row), json.loads(made.read_text())
    second, _ = model_path(merged_source(row), work, args)
    centre_rows = training_rows(merged_source(row), work)
    output = work / row
    made = work / f"{row}-merge.json"
    if not made.exists():
        if row in SWEPT:
            report = merge_row(work, second, str(output), centre_rows, rule=SWEPT[row])
        else:  # WEIGHT_FROM's chosen weight, applied to another fine-tuned model
            _, swept = model_path(WEIGHT_FROM, work, args)
            report = merge_row(work, second, str(output), centre_rows, t=swept["chosen_t"])
        made.write_text(json.dumps(report, indent=1))
    return str(output), json.loads(made.read_text())


def check_recommended_is_shipped() -> None:
    """The recommended row must be what the shipped configs make: its fine-tuned row's recipe leaves the training
    config as it is, and the merge config merges that model by the row's rule."""
    trained = merged_source(RECOMMENDED)
    shipped = load_config(str(CONFIG))
    if row_config(trained) != shipped:
        raise SystemExit(f"{trained}'s recipe {RECIPES[trained]} is not {CONFIG.relative_to(ROOT)}")
    merge = load_merge_config(str(MERGE_CONFIG))
    rule = SWEPT[RECOMMENDED]
    expected = from_dict(MergeConfig, {"first": merge.first, "second": merge.second, "output": merge.output,
                                       "dev": [dataclasses.asdict(s) for s in merge.dev or []], **rule})
    if (merge.second, merge.binary_centre_data) != (shipped.output, shipped.data.url) or any(
        getattr(merge, field) != getattr(expected, field) for field in rule
    ):
        raise SystemExit(f"{MERGE_CONFIG.relative_to(ROOT)} does not merge {CONFIG.relative_to(ROOT)}'s model "
                         f"(second, binary_centre_data) by {RECOMMENDED}'s rule {rule}")


def row_file(work: Path, name: str, eval_max_length: int) -> Path:
    """Where a measured row is saved: one file per row and evaluation length."""
    return work / f"row-{name}-len{eval_max_length}.json"


def table_name(eval_max_length: int) -> str:
    """``quality_table`` at the default evaluation length, ``quality_table-len<N>`` at another."""
    return "quality_table" if eval_max_length == DEFAULT_EVAL_MAX_LENGTH else f"quality_table-len{eval_max_length}"


def seed_rows(previous: Path, work: Path, eval_max_length: int) -> list[str]:
    """Write the rows of an earlier table under ``work`` where not measured there, each marked ``seeded_from``
    that table's command, commit and start; their names. A merge's source still trains if the merge is missing.
    A table evaluated at another length is refused."""
    earlier = json.loads(previous.read_text())
    if earlier["figures"]["eval_max_length"] != eval_max_length:
        raise SystemExit(f"--previous {previous} was evaluated at max_length {earlier['figures']['eval_max_length']},"
                         f" not --eval-max-length {eval_max_length}")
    seeded = []
    for name, entry in earlier["figures"]["rows"].items():
        saved = row_file(work, name, eval_max_length)
        if name in ROWS and not saved.exists():
            entry.setdefault("seeded_from", {k: earlier[k] for k in ("command", "commit", "started_at")})
            saved.write_text(json.dumps(entry, indent=1))
            seeded.append(name)
    return seeded


def mean_over_sets(row: dict) -> dict:
    return {q: sum(entry[q] for entry in row.values()) / len(row) for q in QUANTIZATIONS}


def markdown(table: dict) -> str:
    rows, sets = table["rows"], list(table["sets"])
    lines = [
        f"Quality table (`{table['command']}`); INT8 / binary / float; {', '.join(sets)}; "
        f"eval max_length {table['eval_max_length']}. Metric: nDCG@10 (Q2D), recall@10 (Quora Q2Q). Binary: "
        "sign(x) codes by Hamming; rows marked (c): sign(x - c) codes, c the model's saved binary centre, "
        "scored against float queries x - c.",
        "",
        "| row | " + " | ".join(sets) + " | mean |",
        "|---|" + "---|" * (len(sets) + 1),
    ]
    for name, row in rows.items():
        cells = [" / ".join(f"{row['scores'][s][q]:.4f}" for q in ("int8", "binary", "float")) for s in sets]
        mean = row["mean"]
        centred = row.get("binary_code") == CENTRED_BINARY_CODE
        lines.append(f"| {name}{' (c)' if centred else ''} | " + " | ".join(cells) + f" | {mean['int8']:.4f} / {mean['binary']:.4f} / {mean['float']:.4f} |")
    for name, curve in table.get("merge_curves", {}).items():
        lines += ["", f"Merge sweep of {name} (base -> {merged_source(name)}, dev INT8 nDCG@10 on held-out training "
                  "queries):", ""]
        for point in curve["curve"]:
            scores = ", ".join(f"{k} {v:.4f}" for k, v in point["scores"].items())
            lines.append(f"- t={point['t']:g}: {scores}; mean {point['mean']:.4f}")
        lines.append(f"- chosen t={curve['chosen_t']:g} (keep_gain {curve.get('keep_gain')})")
    if table.get("acceptance"):
        lines += ["", "Acceptance:", ""] + [f"- {k}: {v}" for k, v in table["acceptance"].items()]
    return "\n".join(lines) + "\n"


def table_png(table: dict) -> bytes:
    """Top: INT8 per set and plotted row, binary hatched beside it. Bottom: each row's INT8 change vs base."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets, rows = list(table["sets"]), [name for name in PLOTTED if name in table["rows"]]
    width = 0.8 / (2 * len(rows))
    fig, (ax, delta) = plt.subplots(2, 1, figsize=(11, 8), height_ratios=(3, 2))
    base = table["rows"]["base"]["scores"]
    for i, name in enumerate(rows):
        scores = table["rows"][name]["scores"]
        x = [s + (2 * i) * width for s in range(len(sets))]
        bars = ax.bar(x, [scores[s]["int8"] for s in sets], width, label=f"{name} int8")
        color = bars[0].get_facecolor()
        ax.bar([v + width for v in x], [scores[s]["binary"] for s in sets], width, hatch="//",
               color=color, alpha=0.5, label=f"{name} binary")
        delta.bar([v + width / 2 for v in x], [scores[s]["int8"] - base[s]["int8"] for s in sets], 2 * width,
                  color=color, label=name)
    for axis in (ax, delta):
        axis.set_xticks([s + 0.4 - width / 2 for s in range(len(sets))], sets)
        axis.grid(axis="y", alpha=0.3)
    ax.set_ylabel("nDCG@10 (Quora: recall@10)")
    ax.legend(fontsize=7, ncol=2)
    delta.axhline(0, color="black", linewidth=0.8)
    delta.set_ylabel("INT8 change vs base")
    return figure_png(fig)


def acceptance(rows: dict) -> dict:
    """The issue's acceptance checks on the recommended row: value, target and whether it is met."""
    if "base" not in rows or RECOMMENDED not in rows:
        return {}
    base, rec = rows["base"]["scores"], rows[RECOMMENDED]["scores"]
    worst = min(base, key=lambda s: rec[s]["int8"] - base[s]["int8"])
    checks = {
        "scifact_int8": (rec["scifact"]["int8"], ">= 0.70", rec["scifact"]["int8"] >= 0.70),
        "worst_int8_change_vs_base": (rec[worst]["int8"] - base[worst]["int8"], f">= 0 ({worst})",
                                      rec[worst]["int8"] >= base[worst]["int8"]),
        "mean_int8_gain_vs_base": (rows[RECOMMENDED]["mean"]["int8"] - rows["base"]["mean"]["int8"], ">= 0.02",
                                   rows[RECOMMENDED]["mean"]["int8"] - rows["base"]["mean"]["int8"] >= 0.02),
        "scifact_int8_minus_binary": (rec["scifact"]["int8"] - rec["scifact"]["binary"], "<= 0.03",
                                      rec["scifact"]["int8"] - rec["scifact"]["binary"] <= 0.03),
    }
    out = {name: {"value": round(value, 4), "target": target, "met": met} for name, (value, target, met) in checks.items()}
    intervals = int8_change_intervals(base, rec)
    if intervals:
        out["int8_change_vs_base_ci95"] = intervals
        if worst in intervals:
            out["worst_int8_change_vs_base"]["ci95"] = intervals[worst]["ci95"]
    return out


def int8_change_intervals(base: dict, row: dict) -> dict:
    """Per set where both rows kept per-query scores: the INT8 change and its paired-bootstrap 95% interval
    (how far a change could be query sampling: an interval across 0 is no measurable change)."""
    out = {}
    for name in base:
        if "int8_per_query" in base[name] and "int8_per_query" in row.get(name, {}):
            change, low, high = paired_bootstrap(base[name]["int8_per_query"], row[name]["int8_per_query"])
            out[name] = {"change": round(change, 4), "ci95": [round(low, 4), round(high, 4)]}
    return out


def build_table(measured: dict, args, result: Result) -> dict:
    rows = {name: measured[name] for name in ROWS if name in measured}
    set_names = list(next(iter(rows.values()))["scores"])
    sets = {
        s: {"metric": rows[next(iter(rows))]["scores"][s]["metric"],
            **{name: {q: row["scores"][s][q] for q in QUANTIZATIONS} for name, row in rows.items()}}
        for s in set_names
    }
    for s in sets:
        if RECOMMENDED in rows:
            sets[s]["recommended"] = sets[s][RECOMMENDED]
    ablations = [
        {"ablation": what, "without": a, "with": b,
         "mean_int8": {a: rows[a]["mean"]["int8"], b: rows[b]["mean"]["int8"]},
         "scifact_binary_gap": {n: rows[n]["scores"]["scifact"]["int8"] - rows[n]["scores"]["scifact"]["binary"]
                                for n in (a, b)}}
        for what, a, b in ABLATIONS if a in rows and b in rows
    ]
    curves = {name: rows[name]["made"] for name in SWEPT if name in rows and "curve" in rows[name]["made"]}
    return {
        "command": " ".join(["python", *result.argv]),
        "eval_max_length": args.eval_max_length,
        "sets": sets,
        "recommended": RECOMMENDED,
        "recommended_config": "jobs/configs/minilm-general.yaml",
        "merge_config": "jobs/configs/minilm-general-merge.yaml",
        "rows": rows,
        "missing_rows": [name for name in ROWS if name not in rows],
        "ablations": ablations,
        "merge_curve": curves.get(RECOMMENDED),
        "merge_curves": curves,
        "acceptance": acceptance(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {ROWS}")
    parser.add_argument("--work", default=WORK)
    parser.add_argument("--eval-max-length", type=int, default=DEFAULT_EVAL_MAX_LENGTH,
                        help="tokens per text when evaluating; another length writes quality_table-len<N>.*")
    parser.add_argument("--steps", type=int, help="optimizer steps per recipe (default: the config's epochs)")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--previous", type=Path,
                        help="an earlier quality_table.json: its rows count as measured unless measured under --work")
    parser.add_argument("--remeasure", default="",
                        help="comma-separated rows evaluated again even where measured or seeded (their models "
                             "are kept)")
    parser.add_argument("--cache", default=EVAL_CACHE)
    args = parser.parse_args()
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    remeasure = [r.strip() for r in args.remeasure.split(",") if r.strip()]
    wanted += [r for r in remeasure if r not in wanted]
    unknown = [r for r in wanted if r not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known {list(ROWS)}")
    check_recommended_is_shipped()
    output = table_name(args.eval_max_length)
    result = Result(output)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.previous:
        print(f"rows from {args.previous}: {seed_rows(args.previous, work, args.eval_max_length)}", flush=True)
    sets = eval_sets(heldout_dataset(QUORA_HELDOUT))
    measured = {}
    for name in ROWS:
        saved = row_file(work, name, args.eval_max_length)
        if name in remeasure:
            saved.unlink(missing_ok=True)
        if name in wanted and not saved.exists():
            started = time.time()
            path, made = model_path(name, work, args)
            scores = evaluate_model(name, path, sets, args)
            entry = {"model": path, "made": made, "binary_code": binary_code(path), "scores": scores,
                     "mean": mean_over_sets(scores),
                     "wall_s": round(time.time() - started, 1),
                     "measured": {**result.git, "started_at": result.started_at}}
            saved.write_text(json.dumps(entry, indent=1))
        if saved.exists():
            measured[name] = json.loads(saved.read_text())
    table = build_table(measured, args, result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{output}.md").write_text(markdown(table))
    (RESULTS / f"{output}.png").write_bytes(table_png(table))
    curve_png = work / RECOMMENDED / "merge_sweep.png"
    if curve_png.exists():
        (RESULTS / "quality_table_merge_curve.png").write_bytes(curve_png.read_bytes())
    result.write(table, top_level={k: table[k] for k in ("sets", "recommended_config")})
    print(markdown(table))


if __name__ == "__main__":
    main()
