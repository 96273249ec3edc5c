"""The jobs as a user meets them: a mistake the user can fix ends the job with exit status 2 and one line on
stderr, ``<job>: error: <message>``, without a traceback, in seconds (flags and configs are checked before
Ray or torch are imported; input, model and output locations before Ray starts). Each job runs as a real
subprocess, as a user runs it; the default model is nameable by its name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_CORPUS = ROOT / "embedlib" / "data" / "cranfield" / "corpus.jsonl"
FAIL_FAST_S = 10.0


def run_job(job: str, *args: str, cwd: Path, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / f"{job}.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=None if env is None else os.environ | env)
    return done, time.monotonic() - started


def assert_one_line_error(done: subprocess.CompletedProcess, job: str, message: str) -> str:
    """Status 2; stderr's last line is the error naming what to fix; no traceback anywhere."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    assert lines and lines[-1].startswith(f"{job}: error: ") and message in lines[-1], done.stderr[-3000:]
    return lines[-1]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


INDEX_MISTAKES = {
    "missing input": lambda tmp: (["--input", str(tmp / "nowhere.jsonl")], "nowhere.jsonl"),
    "missing model": lambda tmp: (["--input", str(SAMPLE_CORPUS), "--model", str(tmp / "no-model")], "model:"),
    "output is a file": lambda tmp: (
        ["--input", str(SAMPLE_CORPUS), "--output", write(tmp / "a-file", "x")], "output:"),
    "bad config field": lambda tmp: (
        ["--config", write(tmp / "job.yaml", "shard_size: 0\n")], "shard_size: must be a positive integer"),
    "unknown config field": lambda tmp: (
        ["--config", write(tmp / "job.yaml", "shard_sise: 10\n")], "shard_sise: unknown field"),
    "missing config file": lambda tmp: (["--config", str(tmp / "none.yaml")], "none.yaml: config file not found"),
    "config not a mapping": lambda tmp: (
        ["--config", write(tmp / "job.yaml", "- a\n- b\n")], "must hold a mapping of config fields"),
}


@pytest.mark.parametrize("case", INDEX_MISTAKES)
def test_index_job_refuses_a_mistake_with_one_line_in_seconds(tmp_path, case):
    args, message = INDEX_MISTAKES[case](tmp_path)
    if "--output" not in args:
        args += ["--output", str(tmp_path / "out")]
    done, seconds = run_job("index", *args, "--no-progress", cwd=tmp_path)
    assert_one_line_error(done, "index", message)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # before Ray: nothing else was printed
    assert seconds < FAIL_FAST_S, f"{case}: {seconds:.1f} s to fail"
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow
def test_an_error_raised_in_a_ray_task_is_one_line_too(tmp_path):
    """A checkpoint folder with a config but no weights passes the location check and fails where the model is
    read, in a Ray task: the job prints the task's error, not the RayTaskError and its remote traceback."""
    model = tmp_path / "half-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    done, _ = run_job("index", "--input", str(SAMPLE_CORPUS), "--model", str(model), "--output",
                      str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    line = assert_one_line_error(done, "index", "missing weights")
    assert str(model) in line


# What Ray's job supervisor puts in the environment of a job submitted with ``--working-dir``.
SUBMITTED = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip"}})}


@pytest.mark.parametrize(
    ("job", "args", "field"),
    [
        ("index", ["--input", "../shared/data/cranfield", "--output", "/tmp/never-written"], "input"),
        ("index", ["--input", str(SAMPLE_CORPUS)], "output"),  # the default output, outputs/index, is relative
        ("evaluate", ["--dataset", "/data/d", "--out", "out/report", "--bm25"], "out"),
        ("train", ["--config", "jobs/configs/tiny-pair.yaml", "--prepare-beir", "../shared/data/scifact"],
         "--prepare-beir"),
    ],
)
def test_a_submitted_job_refuses_relative_paths_and_says_why(tmp_path, job, args, field):
    """The newcomer's ``ray job submit --working-dir . -- python jobs/index.py --input ../shared/data/cranfield``:
    the job runs in a copy of the working dir, so a relative path is refused naming the field and the reason
    (a config file inside the working dir, here ``jobs/configs/...``, is uploaded with it and stays usable)."""
    done, seconds = run_job(job, *args, cwd=ROOT, env=SUBMITTED)
    line = assert_one_line_error(done, job, f"{field}: ")
    assert "relative path" in line and "--working-dir" in line and "absolute path" in line
    assert seconds < FAIL_FAST_S


def test_the_evaluate_and_index_jobs_check_their_configs_without_torch():
    """Flags and configs are validated before torch or the models load (EvalConfig lives in eval/config.py)."""
    code = ("import sys; sys.path.insert(0, 'jobs'); import evaluate, index; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_relative_paths_are_fine_outside_a_submitted_job():
    from embedlib.submitted import check_submitted_paths

    check_submitted_paths({"input": "data/corpus.jsonl"})  # a plain local run: nothing to refuse


def test_evaluate_job_refuses_a_missing_dataset_with_one_line(tmp_path):
    done, _ = run_job("evaluate", "--dataset", str(tmp_path / "no-dataset"), "--bm25", "--out",
                      str(tmp_path / "out"), "--no-progress", cwd=tmp_path)
    assert_one_line_error(done, "evaluate", "no-dataset")


@pytest.mark.parametrize(
    ("job", "args", "message"),
    [
        ("train", ["--config", "jobs/configs/tiny-pair.yaml", "--set", "optimizer.lr=-1"],
         "jobs/configs/tiny-pair.yaml: optimizer.lr: must be > 0"),
        ("train", ["--config", "jobs/configs/tiny-pretrain.yaml"], "is not one of"),
        ("pretrain", ["--config", "jobs/configs/tiny-pretrain.yaml", "--set", "max_steps=0"],
         "jobs/configs/tiny-pretrain.yaml: max_steps: must be >= 1 or null"),
        ("pretrain", ["--config", "jobs/configs/nowhere.yaml"], "config file not found"),
        ("merge", ["--config", "jobs/configs/nowhere.yaml"], "config file not found"),
    ],
)
def test_training_jobs_refuse_a_bad_config_with_one_line_in_seconds(job, args, message):
    done, seconds = run_job(job, *args, cwd=ROOT)
    assert_one_line_error(done, job, message)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert seconds < FAIL_FAST_S, f"{job} {args}: {seconds:.1f} s to fail"


def test_merge_job_names_the_file_and_field(tmp_path):
    config = write(tmp_path / "merge.yaml", "first: a\nsecond: b\noutput: c\nt: 2\n")
    done, _ = run_job("merge", "--config", config, cwd=tmp_path)
    assert_one_line_error(done, "merge", f"{config}: t: must be in [0, 1]")


def load_job(name: str):
    sys.path.insert(0, str(ROOT / "jobs"))
    return __import__(name)


def test_the_default_model_is_nameable_by_its_name():
    from embedlib.data import DEFAULT_MODEL_NAME, default_model_path

    index, evaluate = load_job("index"), load_job("evaluate")
    cfg = index.config_from_args(index.parse_args(["--model", DEFAULT_MODEL_NAME]))
    assert cfg.model == str(default_model_path())
    assert index.config_from_args(index.parse_args(["--model", "/models/x"])).model == "/models/x"
    config = evaluate.config_from_args(evaluate.parse_args(
        ["--dataset", "d", "--out", "o", "--model", DEFAULT_MODEL_NAME, "--model", "mine=s3://b/m"]))
    assert config.models == [f"{DEFAULT_MODEL_NAME}={default_model_path()}", "mine=s3://b/m"]


def test_train_job_names_a_mixture_source_field(tmp_path):
    config = write(tmp_path / "mix.yaml", (
        "stage: triplet\nmodel: all-MiniLM-L6-v2\noutput: out\n"
        "data: {url: rows.parquet, sources: [{name: a, kind: beir, url: x, weight: 0}]}\n"
    ))
    done, _ = run_job("train", "--config", config, "--prepare-mixture", cwd=tmp_path)
    assert_one_line_error(done, "train", f"{config}: data.sources[0].weight: must be > 0")
