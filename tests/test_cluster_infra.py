"""The Ray cluster config passes Ray's own validation; the KubeRay manifests parse and say what matters."""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_yaml_passes_ray_validation():
    from ray.autoscaler._private.util import validate_config

    config = yaml.safe_load((ROOT / "cluster" / "gpu-cluster.yaml").read_text())
    validate_config(config)  # raises on any schema error
    gpu = config["available_node_types"]["gpu_worker"]
    assert gpu["resources"]["GPU"] >= 1 and gpu["max_workers"] >= 1
    assert config["head_node_type"] in config["available_node_types"]

    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu_worker"]["min_workerz"] = 0
    with pytest.raises(Exception, match="min_workerz"):
        validate_config(broken)


def index_args(entrypoint: str) -> list[str]:
    args = shlex.split(entrypoint)
    assert args[:2] == ["python", "jobs/index.py"]
    return args[2:]


def test_kuberay_cluster_and_nightly_rayjob():
    import sys

    sys.path.insert(0, str(ROOT / "jobs"))
    import index as job

    cluster = yaml.safe_load((ROOT / "infra" / "raycluster.yaml").read_text())
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    gpu = next(g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu")
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == gpu["rayStartParams"]["num-gpus"] == "1"
    assert int(gpu["rayStartParams"]["num-cpus"]) < int(limits["cpu"])  # a CPU left free for readers

    cron, configmap = yaml.safe_load_all((ROOT / "infra" / "nightly-reindex.yaml").read_text())
    assert cron["kind"] == "CronJob" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert len(cron["spec"]["schedule"].split()) == 5
    rayjob = yaml.safe_load(configmap["data"]["rayjob.yaml"])
    assert (rayjob["apiVersion"], rayjob["kind"]) == ("ray.io/v1", "RayJob")
    assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
    cfg = job.config_from_args(
        job.parse_args(index_args(rayjob["spec"]["entrypoint"]))
    )  # validated like a run
    assert cfg.input.startswith("s3://") and cfg.gpus_per_actor == 1
    text = (ROOT / "infra" / "nightly-reindex.yaml").read_text() + (
        ROOT / "infra" / "raycluster.yaml"
    ).read_text()
    assert "AWS_SECRET_ACCESS_KEY" not in text and "secretRef" in text
