"""The streaming index build under injected faults, on a 3-node local Ray cluster with S3 behind a proxy.

    python bench/chaos_index.py                                   # 100k documents, 10 faults
    python bench/chaos_index.py --docs 5000 --faults 4 --name chaos_index_small   # about a minute

A synthetic parquet corpus (``index_scale``'s) is written to a moto S3 server reached through a ``TcpProxy``;
a tiny real-format model encodes it. First a fault-free build gives the reference wall time; then the same
corpus is built again while faults are injected at times drawn from a seeded schedule, cycling through:

    node    a worker node running encoder actors is removed; a replacement joins 2 s later
    actor   one encoder actor's process is killed (SIGKILL)
    s3      the S3 endpoint refuses connections for 2-5 s (the proxy is switched off and on)
    driver  the build's driver is killed (SIGKILL); the bench reruns it, which resumes from staging

Each build runs in its own driver process connected to the cluster. The result counts the faults injected and
survived (a fault is survived when no rerun other than a planned one after a driver kill was needed), the
documents lost and duplicated (every shard read back), the documents encoded more than once (the build's
``redone``, from the claims every encoding attempt leaves) and the wall time against the fault-free build.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from build_driver import driver_command, parse_result  # noqa: E402
from index_scale import corpus, read_back_ids, write_corpus  # noqa: E402
from local_cluster import add_worker_node, live_actors, local_cluster  # noqa: E402
from result_file import Result  # noqa: E402
from tcp_proxy import TcpProxy  # noqa: E402

BUCKET = "bench-chaos-index"
KINDS = ("node", "actor", "s3", "driver")
ENCODER = "EncodeActor"
ENCODER_RESOURCE = "encoder"  # carried by the worker nodes only: encoders never run on the head
NODE_REPLACED_AFTER_S = 2.0
# Logical CPUs per node (Ray schedules by these, not by cores): the join of a resumed run runs shuffle tasks of a
# whole CPU each (fixed by Ray Data), which must fit beside the encoder actors' fractions on some node.
NODE_CPUS = 2


def start_driver(args: argparse.Namespace, input_url: str, output: str, model: str, env: dict,
                 log: Path) -> subprocess.Popen:
    command = driver_command(
        input=input_url, output=output, model=model, shard_size=args.shard_size, batch_rows=args.batch_rows,
        actors=2, cpus_per_actor=0.25, actor_resources={ENCODER_RESOURCE: 0.5}, stall_timeout_s=120,
        max_actor_restarts=args.max_restarts, max_task_retries=args.max_restarts)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=open(log, "a"), text=True,
                            start_new_session=True)


def driver_result(driver: subprocess.Popen) -> dict | None:
    return parse_result(driver.stdout.read())


def schedule(count: int, seconds: float, seed: int) -> list[dict]:
    """``count`` faults at sorted random times within ``seconds``; kinds cycle through ``KINDS`` in a
    seeded random order, so every kind is injected."""
    rng = np.random.default_rng(seed)
    kinds = [KINDS[i % len(KINDS)] for i in range(count)]
    rng.shuffle(kinds)
    times = np.sort(rng.uniform(0.05, 1.0, count)) * seconds
    return [{"kind": kind, "at_s": round(float(t), 1), "seed": int(rng.integers(1 << 31))}
            for kind, t in zip(kinds, times, strict=True)]


class Injector:
    """Applies one fault to the cluster, the S3 proxy or the current driver; returns what it did."""

    def __init__(self, cluster, proxy: TcpProxy):
        self.cluster, self.proxy = cluster, proxy

    def ready(self, fault: dict) -> bool:
        """Actor and node faults wait until encoder actors run (a rerun may still be planning)."""
        return fault["kind"] not in ("actor", "node") or bool(live_actors(ENCODER))

    def inject(self, fault: dict, driver: subprocess.Popen) -> str:
        rng = np.random.default_rng(fault["seed"])
        return getattr(self, fault["kind"])(rng, driver)

    def node(self, rng, driver) -> str:
        import ray

        hosts = {a["Address"]["NodeID"] for a in live_actors(ENCODER)}
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        workers = [w for w in self.cluster.worker_nodes if w.node_id in alive]
        chosen = [w for w in workers if w.node_id in hosts] or workers
        node = chosen[int(rng.integers(len(chosen)))]
        had = sum(a["Address"]["NodeID"] == node.node_id for a in live_actors(ENCODER))
        self.cluster.remove_node(node)
        time.sleep(NODE_REPLACED_AFTER_S)
        add_worker_node(self.cluster, f"node-r{int(time.time())}", cpus=NODE_CPUS,
                        resources={ENCODER_RESOURCE: 1})
        return f"removed a worker node running {had} encoder actor(s); a replacement joined"

    def actor(self, rng, driver) -> str:
        actors = live_actors(ENCODER)
        if not actors:
            return "no encoder actor alive (none killed)"
        victim = actors[int(rng.integers(len(actors)))]
        os.kill(victim["Pid"], signal.SIGKILL)
        return f"killed encoder actor pid {victim['Pid']}"

    def s3(self, rng, driver) -> str:
        seconds = float(rng.uniform(2, 5))
        self.proxy.down()
        time.sleep(seconds)
        self.proxy.up()
        return f"S3 endpoint down for {seconds:.1f} s"

    def driver(self, rng, driver) -> str:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        return "driver killed; rerun"


def chaos_build(args, injector: Injector, faults: list[dict], build) -> dict:
    """Run the build, injecting ``faults`` at their times; rerun after a driver kill (planned) or a failure
    (unplanned, charged to the last fault). Returns the last run's summary and what happened."""
    started = time.perf_counter()
    pending = list(faults)
    injected, reruns, unplanned = [], 0, 0
    driver = build()
    while True:
        if driver.poll() is not None:
            result = driver_result(driver)
            if driver.returncode == 0 and result:
                break
            unplanned += 1
            if injected:
                injected[-1]["survived"] = False
            print(f"build failed ({driver.returncode}); rerun", flush=True)
            driver = build()
            continue
        elapsed = time.perf_counter() - started
        if pending and elapsed >= pending[0]["at_s"] and injector.ready(pending[0]):
            fault = pending.pop(0)
            what = injector.inject(fault, driver)
            injected.append(fault | {"injected_at_s": round(elapsed, 1), "what": what, "survived": True})
            print(f"{elapsed:6.1f} s  {fault['kind']:6s} {what}", flush=True)
            if fault["kind"] == "driver":
                reruns += 1
                driver = build()
            continue
        time.sleep(0.1)
    return {"summary": result, "seconds": time.perf_counter() - started, "injected": injected,
            "not_injected": pending, "planned_reruns": reruns, "unplanned_reruns": unplanned}


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-size", type=int, default=50_000)
    parser.add_argument("--batch-rows", type=int, default=1024)
    parser.add_argument("--max-restarts", type=int, default=8, help="encoder actor restarts and batch retries")
    parser.add_argument("--name", default="chaos_index")
    args = parser.parse_args()
    result = Result(args.name)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    import ray
    from s3_endpoint import start_s3_endpoint

    from embedlib.models.tiny import make_tiny_checkpoint

    server = start_s3_endpoint(BUCKET)
    proxy = TcpProxy("127.0.0.1", server._server.server_port)
    os.environ["AWS_ENDPOINT_URL"] = proxy.url  # every S3 request goes through the proxy, which the bench cuts
    work = Path(tempfile.mkdtemp(prefix="chaos-index-"))
    model = str(make_tiny_checkpoint(work / "tiny-bert", "bert"))
    ids, texts = corpus(args.docs)
    input_url = f"s3://{BUCKET}/corpus-{args.docs}"
    write_corpus(input_url, ids, texts)
    del texts
    log = work / "drivers.log"

    with local_cluster(head_cpus=NODE_CPUS, worker_cpus=NODE_CPUS,
                       worker_resources={ENCODER_RESOURCE: 1}) as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        env = dict(os.environ, RAY_ADDRESS=cluster.address, PYTHONPATH=str(ROOT))

        def build(output: str):
            return lambda: start_driver(args, input_url, output, model, env, log)

        started = time.perf_counter()
        clean = build(f"s3://{BUCKET}/index-fault-free")()
        clean.wait()
        if clean.returncode or not driver_result(clean):
            raise SystemExit(f"the fault-free build failed; see {log}")
        clean_seconds = time.perf_counter() - started
        print(f"fault-free build: {clean_seconds:.1f} s", flush=True)

        faults = schedule(args.faults, clean_seconds, args.seed)
        output = f"s3://{BUCKET}/index-chaos"
        chaos = chaos_build(args, Injector(cluster, proxy), faults, build(output))
        found = read_back_ids(output)
        ray.shutdown()

    counts = Counter(found)
    lost = len(set(ids) - set(counts))
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    summary = chaos["summary"]
    survived = sum(f["survived"] for f in chaos["injected"])
    figures = {
        "documents": args.docs, "seed": args.seed, "model": "tiny random BERT (real format, embedlib.models.tiny)",
        "cluster": f"head + 2 worker nodes (ray.cluster_utils.Cluster), {NODE_CPUS} logical CPUs each, encoders "
                   "on worker nodes only",
        "endpoint": "moto server behind a TcpProxy (S3 over HTTP)", "batch_rows": args.batch_rows,
        "max_actor_restarts": args.max_restarts, "max_task_retries": args.max_restarts,
        "faults": chaos["injected"], "faults_not_injected": chaos["not_injected"],
        "faults_injected": len(chaos["injected"]), "faults_survived": survived,
        "lost": lost, "duplicated": duplicated, "ids_read_back": len(found),
        "redone_docs": summary["redone"], "extra_reencoded_pct": round(100 * summary["redone"] / args.docs, 2),
        "planned_reruns_after_driver_kill": chaos["planned_reruns"], "unplanned_reruns": chaos["unplanned_reruns"],
        "fault_free_seconds": round(clean_seconds, 1), "chaos_seconds": round(chaos["seconds"], 1),
        "chaos_vs_fault_free": round(chaos["seconds"] / clean_seconds, 2), "last_run": summary,
        "injected_by_kind": dict(Counter(f["kind"] for f in chaos["injected"])),
    }
    result.write(figures)
    print(table([
        ("faults injected / survived", f"{len(chaos['injected'])} / {survived} "
                                       f"({figures['injected_by_kind']})"),
        ("documents lost", str(lost)), ("documents duplicated", str(duplicated)),
        ("extra documents re-encoded", f"{summary['redone']} ({figures['extra_reencoded_pct']} %)"),
        ("reruns (after driver kills / unplanned)", f"{chaos['planned_reruns']} / {chaos['unplanned_reruns']}"),
        ("wall time fault-free / chaos", f"{clean_seconds:.1f} s / {chaos['seconds']:.1f} s "
                                         f"({figures['chaos_vs_fault_free']}x)"),
    ]))
    proxy.down()
    server.stop()


if __name__ == "__main__":
    main()
