"""trn1_bert_pretrain end to end on a real local UltraCluster: moto server, the pcluster-compatible CLI,
slurmctld/slurmd/sshd, and the real BERT training job — first under dag.test(), then under a real
scheduler + triggerer with the run triggered through the REST API. Afterwards nothing may be left:
no cluster, stack, VPC, NAT gateway, Slurm job or daemon.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import DAG_ID, REPO, VENVS, _s3, assert_nothing_left, results_in_s3

RUNTIME_READY = os.geteuid() == 0 and bool(shutil.which("slurmctld")) and Path("/usr/sbin/sshd").exists()
pytestmark = [pytest.mark.e2e, pytest.mark.localcluster,
              pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd (make setup)")]

TASK_IDS = {"create_vpc", "render_config", "pcluster_create", "wait_for_fleet", "download_data",
            "parallel_compile", "train", "collect_results", "delete_cluster", "delete_vpc"}
RUN_TIMEOUT_S = 1200


def check_results(metrics: dict, env: dict[str, str], run_id: str) -> None:
    assert metrics["nodes"] == 2 and metrics["scaling_mode"] == "strong"
    # Local profile: batch 8 × accumulation 2 (strong scaling keeps it: 2 / 2 nodes × 2 ranks).
    assert metrics["global_batch"] == 16, metrics
    assert metrics["final_loss"] > 0 and metrics["average_throughput_seq_per_s"] > 0
    assert metrics["peak_throughput_seq_per_s"] >= metrics["average_throughput_seq_per_s"]
    # The layout: <artifacts>/results/<dag_id>/<run_id>/
    keys = results_in_s3(env, f"runs/results/{DAG_ID}/{run_id}/")
    names = {Path(key).name: size for key, size in keys.items()}
    assert names.get("results.json", 0) > 0, "\n".join(f"{k} {v}" for k, v in keys.items())
    assert [n for n in names if n.startswith("log_ph1_bf16_")], keys
    assert metrics["artifacts_uri"] == f"s3://ultracluster-artifacts/runs/results/{DAG_ID}/{run_id}/"
    # It really trained: the running loss recorded in results.json falls clearly over the 40 steps.
    key = next(k for k in keys if k.endswith("/results.json"))
    body = _s3(env["AWS_ENDPOINT_URL"]).get_object(Bucket="ultracluster-artifacts", Key=key)["Body"].read()
    losses = [m["MeasuredValue"] for m in json.loads(body)["results"]["metrics"] if m["MetricName"] == "Loss"]
    assert len(losses) >= 2 and losses[-1] < losses[0] - 0.5, losses


def test_dag_test_runs_the_whole_pipeline(deployment, uc_home):
    env = deployment
    subprocess.run([str(VENVS / "airflow" / "bin" / "airflow"), "db", "migrate"], env=env, check=True,
                   capture_output=True, timeout=300)
    done = subprocess.run([str(VENVS / "airflow" / "bin" / "python"), str(REPO / "tests" / "e2e" / "run_dag_test.py")],
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    log = REPO / "out" / "e2e" / "dag_test.log"  # kept for a post-mortem (git-ignored)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("E2E_RESULT ")]
    assert lines, f"no result line; rc={done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    outcome = json.loads(lines[-1].removeprefix("E2E_RESULT "))
    assert outcome["tasks"] == {task: "success" for task in TASK_IDS}, done.stderr[-8000:]
    assert outcome["state"] == "success"
    check_results(outcome["results"], env, outcome["run_id"])
    assert_nothing_left(env, uc_home)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AirflowApi:
    def __init__(self, base: str) -> None:
        self.base = base
        self.token: str | None = None

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(self.base + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def healthy(self) -> bool:
        try:
            self.call("GET", "/api/v2/monitor/health")
            return True
        except (OSError, urllib.error.HTTPError):
            return False


@pytest.fixture
def airflow_standalone(deployment, tmp_path):
    """A real Airflow (api-server, scheduler, dag-processor, triggerer) on a free loopback port."""
    port = _free_port()
    home = Path(deployment["AIRFLOW_HOME"])
    (home / "passwords.json").write_text(json.dumps({"admin": "e2e-password"}))
    env = {
        **deployment,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
    }
    log = open(home / "standalone.log", "w")
    process = subprocess.Popen([str(VENVS / "airflow" / "bin" / "airflow"), "standalone"], env=env,
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    api = AirflowApi(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 180
        while not api.healthy():
            assert process.poll() is None, (home / "standalone.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "airflow standalone not healthy in 180 s"
            time.sleep(1)
        api.token = api.call("POST", "/auth/token", {"username": "admin", "password": "e2e-password"})["access_token"]
        yield api, env
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_rest_triggered_run_under_scheduler_and_triggerer(airflow_standalone, uc_home):
    api, env = airflow_standalone
    deadline = time.monotonic() + 120
    while True:  # the dag-processor needs a moment to parse the file
        try:
            api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
            break
        except urllib.error.HTTPError as err:
            assert err.code == 404 and time.monotonic() < deadline, err
            time.sleep(2)
    run = api.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {}})
    run_id = run["dag_run_id"]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    state = run["state"]
    while state not in ("success", "failed"):
        assert time.monotonic() < deadline, f"run still {state} after {RUN_TIMEOUT_S} s"
        time.sleep(3)
        state = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
    tis = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
    states = {ti["task_id"]: ti["state"] for ti in tis}
    assert states == {task: "success" for task in TASK_IDS}, states
    assert state == "success"
    xcom = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/collect_results"
                    "/xcomEntries/return_value")
    metrics = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    check_results(metrics, env, run_id)
    assert_nothing_left(env, uc_home)
