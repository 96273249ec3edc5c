"""Issue 6 acceptance: DiffRetriever retrieval with this project's own diffusion-pretrained model on SciFact,
zero-shot and after contrastive fine-tuning (dense MaxSim + sparse InfoNCE on SciFact train pairs, through
the Ray Train + DeepSpeed runner); K=1 vs K>1, dense vs sparse vs hybrid, BM25 alongside. Scores come from
the evaluation job's library (what ``jobs/evaluate.py --method diffretriever`` runs).

    python bench/diffretriever_finetune.py                     # pretrains a tiny Qwen3 first (runner)
    python bench/diffretriever_finetune.py --pretrained /tmp/embedlib-bench/ablation-400/diffusion-pretrained
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np
import ray
import torch
from result_file import parse_with_result

from embedlib.encoding.representative_tokens import DiffRetrieverEncoder
from embedlib.eval.beir import load_beir
from embedlib.eval.job import EvalConfig, run_evaluation
from embedlib.models.tiny import make_tiny_checkpoint
from embedlib.training.config import TrainConfig, from_dict
from embedlib.training.data import beir_pairs, text_rows, write_rows
from embedlib.training.plots import loss_curves_png
from embedlib.training.runner import train

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SETTINGS = ((1, [1]), (16, [1, 4, 16]))  # (K_p, K_q values): K=1 on both sides vs the published K_p=16


def stage(name: str, model: str, output: Path, data: Path, steps: int, lr: float, args, **extra) -> TrainConfig:
    return from_dict(TrainConfig, {
        "stage": name, "model": model, "output": str(output), "run_name": f"dr-{name}-{int(time.time())}",
        "data": {"url": str(data), "max_length": args.max_length, "query_max_length": 32},
        "batch_size": args.batch_size, "max_steps": steps, "seed": 0,
        "optimizer": {"lr": lr, "warmup_steps": max(1, steps // 10), "schedule": "cosine"},
        "deepspeed": {"zero_stage": 2, "precision": "fp32"},
        "scaling": {"num_workers": 1, "cpus_per_worker": 1, "torch_threads": 2},
        "checkpoint_every": steps, **extra,
    })


def pretrain(work: Path, args) -> tuple[str, list[dict]]:
    files = sorted((DATA / "text" / "gutenberg").glob("*.txt")) + [DATA / "text" / "wikitext2.valid.tokens"]
    rows = text_rows(files, chars_per_row=700)
    random.Random(0).shuffle(rows)
    write_rows(rows, str(work / "text.parquet"))
    shape = {"hidden_size": args.hidden, "intermediate_size": 2 * args.hidden, "num_hidden_layers": args.layers,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": args.hidden // 4}
    base = make_tiny_checkpoint(work / "init", "qwen3-causal", texts=[r["text"] for r in rows[:3000]], **shape)
    result = train(stage("pretrain", str(base), work / "pretrained", work / "text.parquet",
                         args.pretrain_steps, 2e-3, args))
    return str(work / "pretrained"), result.history


def mask_state_cosine(model: str, texts: list[str], k: int = 16) -> float:
    """Mean cosine between different passages' mean mask-position states: near 1 means the states ignore the
    passage (nothing for MaxSim to rank by)."""
    encoder = DiffRetrieverEncoder.from_pretrained(model, device="cpu")
    means = torch.tensor(np.stack([v.mean(0) for v in encoder.encode(texts, k=k, kind="passage").dense]))
    unit = torch.nn.functional.normalize(means, dim=-1)
    cosines = unit @ unit.T
    n = len(texts)
    return float((cosines.sum() - cosines.diagonal().sum()) / (n * (n - 1)))


def evaluate(model: str, tag: str, work: Path, args) -> dict:
    """System name -> metrics, over both K settings (BM25 once)."""
    systems = {}
    for k_passage, k_query in SETTINGS:
        config = EvalConfig(out=str(work / f"eval-{tag}-kp{k_passage}"), dataset=str(DATA / "scifact"),
                            models=[f"{tag}={model}"], method="diffretriever", k_passage=k_passage,
                            k_query=k_query, bm25=k_passage == 1, max_length=args.eval_max_length)
        for name, entry in run_evaluation(config)["systems"].items():
            systems[name.replace(f"{tag}/", f"Kp={k_passage}/")] = entry
    return systems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", default="/tmp/embedlib-bench/diffretriever")
    parser.add_argument("--pretrained", help="diffusion checkpoint to start from (default: pretrain one here)")
    parser.add_argument("--pretrain-steps", type=int, default=400)
    parser.add_argument("--finetune-steps", type=int, default=200)
    parser.add_argument("--finetune-lr", type=float, default=5e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128, help="training token cap per passage prompt")
    parser.add_argument("--eval-max-length", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64, help="width of the Qwen3 pretrained here")
    parser.add_argument("--layers", type=int, default=2, help="depth of the Qwen3 pretrained here")
    args, result = parse_with_result(parser, "diffretriever_finetune")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    torch.set_num_threads(2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    curves = {}
    model = args.pretrained
    if model is None:
        model, curves["diffusion pretraining"] = pretrain(work, args)
    pairs = beir_pairs(load_beir(str(DATA / "scifact"), "train"))
    random.Random(0).shuffle(pairs)
    write_rows(pairs, str(work / "pairs.parquet"))
    tuned = train(stage("diffretriever", model, work / "finetuned", work / "pairs.parquet",
                        args.finetune_steps, args.finetune_lr, args, k_query=4, k_passage=16, hard_negatives=0))
    curves["DiffRetriever fine-tuning"] = tuned.history
    results = {"zero-shot": evaluate(model, "zero-shot", work, args),
               "fine-tuned": evaluate(str(work / "finetuned"), "fine-tuned", work, args)}
    probe = load_beir(str(DATA / "scifact"), "test").doc_texts()[:64]
    cosine = {"zero-shot": mask_state_cosine(model, probe), "fine-tuned": mask_state_cosine(str(work / "finetuned"), probe)}
    for name, history in curves.items():
        (work / f"{name.split()[0].lower()}_loss.png").write_bytes(loss_curves_png({name: history}))
    result.write({"args": vars(args), "results": results, "mask_state_cosine": cosine})
    print(f"\nSciFact test, model {model} ({len(pairs)} train pairs, {args.finetune_steps} fine-tuning steps)")
    print(f"{'system':<24}{'zero-shot nDCG@10':>19}{'R@100':>8}{'fine-tuned nDCG@10':>20}{'R@100':>8}{'B/doc':>9}")
    for name, entry in results["fine-tuned"].items():
        before = results["zero-shot"].get(name, entry)["metrics"]
        after = entry["metrics"]
        print(f"{name:<24}{before['ndcg@10']:>19.4f}{before['recall@100']:>8.4f}{after['ndcg@10']:>20.4f}"
              f"{after['recall@100']:>8.4f}{entry['storage']['bytes_per_doc']:>9.0f}")
    print(f"mean cosine between 64 passages' mask states (1 = collapsed): zero-shot {cosine['zero-shot']:.5f}, "
          f"fine-tuned {cosine['fine-tuned']:.5f}")
    print(f"wall {time.time() - started:.0f} s; reports under {work}/eval-*")


if __name__ == "__main__":
    main()
