"""Acceptance 2, the paper's ablation at small scale and equal compute. A tiny Qwen3 (one random init) is
pretrained from scratch on the shared text with
  (a) the diffusion objective + bidirectional attention, then mean pooling, or
  (b) next-token prediction + causal attention, then last-token pooling,
for the same steps, batch and sequence length; both then get identical pair training on SciFact train and
are scored on Cranfield and CISI (out of domain, small enough to encode here).
Prints both models' retrieval scores (INT8 path) and writes one PNG with both contrastive loss curves.

    python bench/train_ablation.py --pretrain-steps 100 --pair-steps 50 --batch-size 16 --max-length 96
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from result_file import parse_with_result
from train_common import plain_loop, retrieval_scores

from embedlib.encoding.encoder import Encoder
from embedlib.eval.beir import load_beir
from embedlib.models.tiny import make_tiny_checkpoint
from embedlib.training.causal_ablation import load_causal_backbone
from embedlib.training.config import TrainConfig, from_dict
from embedlib.training.data import beir_pairs, text_rows
from embedlib.training.plots import loss_curves_png

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
EVAL_SETS = ("cranfield", "cisi")  # small corpora: a tiny model encodes them in minutes here


def config(stage: str, model: Path, output: Path, causal: bool, steps: int, args) -> TrainConfig:
    return from_dict(
        TrainConfig,
        {
            "stage": stage,
            "model": str(model),
            "output": str(output),
            "causal": causal,
            "data": {"url": "in-process", "max_length": args.max_length, "query_max_length": 32},
            "batch_size": args.batch_size,
            "max_steps": steps,
            "seed": 0,
            "optimizer": {
                "lr": args.pretrain_lr if stage == "pretrain" else args.pair_lr,
                "warmup_steps": steps // 10,
                "schedule": "cosine",
            },
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", default="/tmp/embedlib-bench/ablation")
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--pair-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--pretrain-lr", type=float, default=2e-3)
    parser.add_argument("--pair-lr", type=float, default=1e-3)
    args, result = parse_with_result(parser, "train_ablation")
    work = Path(args.work)
    started = time.time()
    files = sorted((DATA / "text" / "gutenberg").glob("*.txt")) + [DATA / "text" / "wikitext2.valid.tokens"]
    text = text_rows(files, chars_per_row=700)
    random.Random(0).shuffle(text)
    base = make_tiny_checkpoint(work / "init", "qwen3-causal", texts=[r["text"] for r in text[:3000]])
    scifact = load_beir(str(DATA / "scifact"), "train")
    pairs = beir_pairs(scifact)
    random.Random(0).shuffle(pairs)
    arms = {"(a) diffusion + bidirectional + mean": False, "(b) next-token + causal + last-token": True}
    curves, pretrain_curves, scores = {}, {}, {}
    for name, causal in arms.items():
        tag = "causal" if causal else "diffusion"
        pretrained = work / f"{tag}-pretrained"
        pretrain_curves[name] = plain_loop(
            config("pretrain", base, pretrained, causal, args.pretrain_steps, args), text
        )
        trained = work / f"{tag}-pair"
        curves[name] = plain_loop(config("pair", pretrained, trained, causal, args.pair_steps, args), pairs)
        encoder = (
            Encoder(load_causal_backbone(trained))
            if causal
            else Encoder.from_pretrained(trained, device="cpu")
        )
        scores[name] = {
            ds: retrieval_scores(encoder, str(DATA / ds), "test", name=f"{tag}-{ds}") for ds in EVAL_SETS
        }
        print(name, json.dumps(scores[name]), flush=True)
    (work / "pair_loss_curves.png").write_bytes(
        loss_curves_png(curves, ylabel="pair InfoNCE loss (INT8 STE)")
    )
    (work / "pretrain_loss_curves.png").write_bytes(
        loss_curves_png(pretrain_curves, ylabel="pretraining loss")
    )
    result.write({"scores": scores, "pair_curves": curves, "args": vars(args)})
    print(
        f"\n{'arm':<40}" + "".join(f"{ds + ' nDCG@10':>20}" for ds in EVAL_SETS) + f"{'final pair loss':>18}"
    )
    for name in arms:
        final = sum(r["loss"] for r in curves[name][-10:]) / len(curves[name][-10:])
        print(
            f"{name:<40}"
            + "".join(f"{scores[name][ds]['ndcg@10']:>20.4f}" for ds in EVAL_SETS)
            + f"{final:>18.3f}"
        )
    print(f"curves: {work / 'pair_loss_curves.png'}; wall {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
