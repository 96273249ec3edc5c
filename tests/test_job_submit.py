"""``ray job submit`` as the README documents it, end to end with real processes.

A head node of its own is started with ``ray start --head --include-dashboard=true`` (the dashboard is what job
submission talks to: it needs ``ray[default]``) with token authentication on, the index job is submitted with
``--working-dir`` and absolute input/output paths, and the index it publishes is opened and searched. The
node uses its own ports and temp dir and is stopped by its own process ids, never by ``ray stop`` (which
stops every Ray instance on the machine).
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_CORPUS = ROOT / "embedlib" / "data" / "cranfield" / "corpus.jsonl"
WORKER_PORTS = 100  # one port per worker process; the job needs a dozen or so on 2 CPUs
START_TIMEOUT_S = 60
JOB_TIMEOUT_S = 240
# Lines Ray forwards from worker processes start with "(<task or actor> pid=<n>)", possibly after an ANSI colour.
WORKER_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\(\S.*? pid=\d+\)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free just now (all held open together while they are chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_range(count: int, low: int = 20_000, high: int = 30_000) -> range:
    """``count`` consecutive free ports below Linux's ephemeral range (so that no client socket takes one)."""
    for _ in range(50):
        start = random.randrange(low, high - count)
        ports = range(start, start + count)
        if all(port_is_free(p) for p in ports):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports in [{low}, {high})")


@dataclass
class HeadNode:
    dashboard: str  # http://127.0.0.1:<dashboard port>: the address ``ray job submit`` takes
    env: dict[str, str]  # what a client needs: token authentication on, and where the token is
    temp_dir: Path
    process: subprocess.Popen  # ``ray start --head --block``: the node's processes are its children


def ray_cli() -> str:
    """The ``ray`` command of this interpreter's environment."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else shutil.which("ray") or "ray"


def client_env(temp_dir: Path) -> dict[str, str]:
    """Token authentication with a token of this test's own: ``RAY_AUTH_MODE=token`` on the node
    *and* on every client (without it ``ray job submit`` sends no token and the dashboard answers 401), the
    token in a file named by ``RAY_AUTH_TOKEN_PATH`` (default: ``~/.ray/auth_token``)."""
    token_file = temp_dir / "auth_token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file), RAY_USAGE_STATS_ENABLED="0")
    return env


def start_command(temp_dir: Path) -> tuple[list[str], int]:
    """``ray start --head`` on ports of its own (none of Ray's fixed defaults) and the dashboard port."""
    (gcs, dashboard, client, agent, agent_grpc, runtime_env_agent, metrics, node_manager,
     object_manager) = free_ports(9)
    workers = free_port_range(WORKER_PORTS)
    return [
        ray_cli(), "start", "--head", "--block", "--disable-usage-stats", "--num-cpus", "2",
        "--node-ip-address", "127.0.0.1", "--port", str(gcs), "--include-dashboard=true",
        "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard),
        "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
        "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(runtime_env_agent),
        "--metrics-export-port", str(metrics), "--node-manager-port", str(node_manager),
        "--object-manager-port", str(object_manager), "--min-worker-port", str(workers.start),
        "--max-worker-port", str(workers.stop - 1), "--temp-dir", str(temp_dir),
    ], dashboard


def wait_for_dashboard(node: HeadNode, log: Path) -> None:
    """Until the dashboard answers an authenticated request (the node is up), or the node has died."""
    token = Path(node.env["RAY_AUTH_TOKEN_PATH"]).read_text()
    request = urllib.request.Request(f"{node.dashboard}/api/version", headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert node.process.poll() is None, f"ray start exited:\n{log.read_text()[-4000:]}"
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the dashboard did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def node_processes(temp_dir: Path) -> list:
    """This node's processes, found by its temp dir on their command lines (others' Ray processes never are)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and any(str(temp_dir) in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop_node(node: HeadNode) -> None:
    """SIGTERM to ``ray start --block`` (it stops the processes it started), then whatever of this node is left."""
    import psutil

    if node.process.poll() is None:
        node.process.send_signal(signal.SIGTERM)
        try:
            node.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()
    left = node_processes(node.temp_dir)
    for proc in left:
        proc.terminate()
    _, alive = psutil.wait_procs(left, timeout=10)
    for proc in alive:
        proc.kill()
    shutil.rmtree(node.temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def head_node(tmp_path_factory) -> Iterator[HeadNode]:
    # The node's temp dir is a short folder of its own, not under tmp_path: Ray's unix sockets live in
    # <temp dir>/session_<date>_<pid>/sockets/, and pytest's tmp paths push them past the 107-byte limit.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-"))
    command, dashboard_port = start_command(temp_dir)
    log = tmp_path_factory.mktemp("ray-start") / "ray-start.log"
    env = client_env(temp_dir)
    with open(log, "w") as out:
        # No drain wait on SIGTERM (default 30 s: for Serve proxies; this node serves nothing).
        node_env = dict(env, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
        process = subprocess.Popen(command, env=node_env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    node = HeadNode(f"http://127.0.0.1:{dashboard_port}", env, temp_dir, process)
    try:
        wait_for_dashboard(node, log)
        yield node
    finally:
        stop_node(node)
    assert not node_processes(temp_dir), "processes of the test's Ray node outlived it"


def driver_lines(log: str) -> str:
    """The job's own output, without the lines Ray forwards from its worker processes.

    Ray Data's file listing tasks sometimes print an ``InterruptedError`` traceback from an internal thread as
    they are torn down after the read finished (ray/data/_internal/dynamic_work_queue.py); a worker failure
    that matters shows up in the job's status and its counts, which the test checks.
    """
    return "\n".join(line for line in log.splitlines() if not WORKER_LINE.match(line))


def write_corpus(path: Path, docs: int) -> Path:
    with open(SAMPLE_CORPUS) as source, open(path, "w") as target:
        for line in list(source)[:docs]:
            target.write(line)
    return path


def test_index_job_submitted_with_ray_job_submit(head_node, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 24)
    output = tmp_path / "index"
    submit = [
        ray_cli(), "job", "submit", "--address", head_node.dashboard, "--working-dir", str(ROOT), "--",
        "python", "jobs/index.py", "--input", str(corpus), "--output", str(output),
        "--model", "all-MiniLM-L6-v2", "--no-progress",
    ]
    started = time.monotonic()
    job = subprocess.run(submit, env=head_node.env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    log = job.stdout + job.stderr
    assert job.returncode == 0, log[-6000:]
    assert "succeeded" in log, log[-6000:]
    assert "24 docs in, 24 embedded" in log and "Traceback" not in driver_lines(log), log[-6000:]
    print(f"ray job submit: {time.monotonic() - started:.1f} s")

    from embedlib.data import default_model_path
    from embedlib.index import ShardedIndex

    index = ShardedIndex.open(str(output))
    assert len(index) == 24
    assert index.manifest["model"]["source"] == str(default_model_path())  # the name resolved in the job
    first = json.loads(SAMPLE_CORPUS.read_text().splitlines()[0])
    assert index.search([first["text"]], k=1).ids[0][0] == str(first["_id"])


def test_submitting_without_the_token_setting_is_refused(head_node):
    """What a new user met: without ``RAY_AUTH_MODE=token`` on the client, the dashboard refuses the job."""
    env = {k: v for k, v in head_node.env.items() if k != "RAY_AUTH_MODE"}
    job = subprocess.run(
        [ray_cli(), "job", "submit", "--address", head_node.dashboard, "--no-wait", "--", "true"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert job.returncode != 0
    assert "Authentication" in job.stdout + job.stderr
