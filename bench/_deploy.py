"""The benchmarks' own deployment: `make up`'s scripts (moto, buckets, key pair, dataset, PostgreSQL,
Airflow's four components) in a home of their own under /tmp, on free loopback ports and local-cluster
slots 100-119, so a benchmark never meets a developer's `make up` (slots 1-99) or the tests (200-254).

Airflow reads two DAG bundles: the repo's dags/ and bench/dags/ (the baselines, e.g. the no-op DAG of
the pipeline's shape), so the baselines never show up in a user's deployment.

    with Deployment("pipeline") as deployment:
        run_id = deployment.trigger("trn1_bert_pretrain", conf)
        deployment.wait(dag_id, run_id)

Runs in the Airflow venv (the product's REST client, ultracluster.cli.client).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from _record import REPO

sys.path.insert(0, str(REPO))
from tests.fixtures_localcluster import free_port  # noqa: E402 - below the ephemeral range, as the tests'
from ultracluster.cli.client import AirflowClient, CliError  # noqa: E402

VENVS = REPO / ".venvs"
DATASET_TAR = "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar"
# Local-cluster slots of the benchmarks (docs/local-cluster.md): ports LOCAL_UC_PORT_BASE + 100k,
# so 14000-15999, under every other range in use.
SLOTS = {"LOCAL_UC_SLOT_MIN": "100", "LOCAL_UC_SLOT_MAX": "119", "LOCAL_UC_PORT_BASE": "4000",
         "LOCAL_UC_DB_PORT": "4090"}
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
TERMINAL = {"success", "failed"}


def _dataset_home() -> Path:
    return Path(os.environ.get("LOCAL_ULTRACLUSTER_HOME", "/var/lib/local-ultracluster")) / "dataset"


class Deployment:
    """One local deployment for one benchmark; everything stopped and removed on exit."""

    def __init__(self, name: str, extra_env: dict[str, str] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"uc-bench-{name}-", dir="/tmp"))
        self.root.chmod(0o755)  # the cluster user must reach files inside cluster dirs
        self.home = self.root / "home"
        self.airflow_home = self.root / "airflow"
        port = free_port()
        bundles = [{"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},
                   {"name": "bench", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(REPO / "bench" / "dags")}}]
        self.env = {
            **os.environ, **SLOTS,
            "LOCAL_ULTRACLUSTER_HOME": str(self.home),
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
            "AIRFLOW_HOME": str(self.airflow_home), "AIRFLOW_PORT": str(port),
            "ULTRACLUSTER_PG_HOME": str(self.root / "postgres"), "ULTRACLUSTER_PG_PORT": str(free_port()),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            # The baselines' own trigger, imported by the triggerer by its classpath.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "bench" / "dags"), os.environ.get("PYTHONPATH")])),
            **(extra_env or {}),
        }
        self.url = f"http://127.0.0.1:{port}"
        self.client: AirflowClient | None = None

    def __enter__(self) -> "Deployment":
        self.home.mkdir()
        (self.home / "dataset").symlink_to(_dataset_home())  # up.sh reads the dataset from the home
        try:
            self._script("up.sh", timeout=600)
            password = json.loads((self.airflow_home / "passwords.json").read_text())["admin"]
            # A loaded 2-core machine can take longer than the client's 30 s default to answer.
            self.client = AirflowClient(self.url, "admin", password, timeout=120)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_exc) -> None:
        if self.client:
            self.client.close()
        self._script("down.sh", timeout=300, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def _script(self, name: str, *, timeout: float, check: bool = True) -> None:
        done = subprocess.run(["bash", str(REPO / "scripts" / name)], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"scripts/{name} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")

    # -- the REST API --------------------------------------------------------------------------------
    def api(self, method: str, path: str, body: dict | None = None, **params) -> dict:
        for attempt in range(5):
            try:
                return self.client.call(method, path, body, params=params or None)
            except CliError as error:  # reads only: a GET is safe to repeat after a timeout
                if method != "GET" or "cannot reach" not in str(error) or attempt == 4:
                    raise
                time.sleep(5)

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        """Unpaused once the dag-processor has parsed it."""
        deadline = time.monotonic() + timeout
        while self.client.get(f"/api/v2/dags/{dag_id}", missing_ok=True) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id} not parsed after {timeout} s")
            time.sleep(1)
        self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        body = {"logical_date": None, "conf": conf or {}}
        return self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)["dag_run_id"]

    def wait(self, dag_id: str, run_id: str, timeout: float = 1800, poll_s: float = 0.5) -> dict:
        """The run's record once it has ended."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")
            if run["state"] in TERMINAL:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id} {run_id} still {run['state']} after {timeout} s")
            time.sleep(poll_s)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        return self.api("GET", path, limit=100)["task_instances"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[dict]:
        """The task's structured log as Airflow serves it: worker and trigger lines with timestamps."""
        path = (f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}"
                f"/logs/{try_number}")
        return self.api("GET", path, full_content="true").get("content", [])
