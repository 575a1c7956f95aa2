"""The lost-node rule against a REAL local UltraCluster: a dynamic node that takes longer to boot
than the compute-node bootstrap timeout (Slurm's ResumeTimeout) fails its job NODE_FAIL and is
replaced, as clustermgtd does. ``train``'s operator counts the loss, waits for the replacement and
resubmits; a node that boots in time then completes the job. A node that never boots in time is
lost again, past ``node_replacements``, and the task fails naming it.

Run (root; about 2 minutes): .venvs/airflow/bin/python -m pytest -q tests/integration/test_lost_nodes.py
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures_localcluster import wait_until_gone
from tests.integration.test_slurm_side import make_cluster, wait_for_fleet

RUNTIME_READY = os.geteuid() == 0 and bool(shutil.which("slurmctld")) and Path("/usr/sbin/sshd").exists()
pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm and sshd")]

NAME = "lostnode"
NODE = "compute1-dy-trn1-1"
BOOTSTRAP_TIMEOUT_S = 5
SLOW_BOOT_S = 60  # past the timeout: the node never registers in time


class Store(dict):
    def set(self, key, value, **_):
        self[key] = value


def bootstrap_timeout(config: dict) -> None:
    config["DevSettings"] = {"Timeouts": {"ComputeNodeBootstrapTimeout": BOOTSTRAP_TIMEOUT_S}}


@pytest.fixture
def cluster(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch):
    made = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, NAME,
                        {"local-ultracluster:boot-delay": str(SLOW_BOOT_S)}, static=0, dynamic=1,
                        mutate=bootstrap_timeout)
    yield SimpleNamespace(name=NAME, dir=uc_home / "clusters" / NAME, made=made)
    pcluster("delete-cluster", "-n", NAME)
    wait_until_gone(uc_env, NAME, timeout=120)


def boot_fails(cluster) -> int:
    """Boots Slurm gave up on at ResumeTimeout, from the node manager's log."""
    log = cluster.dir / "log" / "power.log"
    return log.read_text().count(f"Node bootstrap error: Resume timeout expires for node {NODE}") if log.exists() else 0


def set_boot_delay(cluster, seconds: float) -> None:
    path = cluster.dir / "runtime.json"
    runtime = json.loads(path.read_text())
    runtime["faults"]["boot_delay"] = seconds
    path.write_text(json.dumps(runtime))


def train(cluster, tmp_path, node_replacements: int):
    from ultracluster.operators.slurm import SlurmJobOperator

    files = tmp_path / "training"
    files.mkdir()
    (files / "run.sh").write_text("#!/bin/bash\necho \"ran on $(hostname)\"\n")
    head = wait_for_fleet(cluster.made, num_nodes=1)
    assert head["status"] == "success", head
    op = SlurmJobOperator(
        task_id="train", head_node=head["head_node"], job_dir="/fsx/jobs/lostnode", num_nodes=1, job_env={},
        run_script="run.sh", training_files_dir=str(files), deferrable=False, poll_interval=1,
        auto_resume_attempts=3, node_replacements=node_replacements, resume_fleet_timeout=180,
        pcluster_conn_id="pcluster_default", region_name="us-east-1")
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=f"manual__lost{node_replacements}", task_id="train",
                         map_index=-1, xcom_push=lambda **_: None)
    return op, {"ti": ti, "task_state_store": Store()}


def test_a_node_past_its_bootstrap_timeout_is_replaced_and_the_job_completes(cluster, tmp_path):
    op, context = train(cluster, tmp_path, node_replacements=1)

    def boot_in_time_once_lost():  # the replacement instance boots in time
        deadline = time.monotonic() + 120
        while boot_fails(cluster) < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        set_boot_delay(cluster, 0)

    watcher = threading.Thread(target=boot_in_time_once_lost, daemon=True)
    watcher.start()
    result = op.execute(context)
    watcher.join()
    assert result["state"] == "COMPLETED", result
    assert boot_fails(cluster) == 1
    assert result["auto_resume"]["nodes_lost"] == {NODE: 1}, result["auto_resume"]
    assert context["task_state_store"]["lost_nodes"]["counts"] == {NODE: 1}


def test_a_node_that_never_boots_in_time_fails_the_run_naming_it(cluster, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    op, context = train(cluster, tmp_path, node_replacements=1)
    with pytest.raises(AirflowFailException) as failed:
        op.execute(context)
    message = str(failed.value)
    assert message.startswith(f"Nodes lost past node_replacements=1: {NODE} ("), message
    assert "lost 2 time(s)" in message.splitlines()[0], message
    # slurmctld runs its ResumeFailProgram (which writes the line) beside marking the node down, which
    # the task saw: give the second line a moment; then no third launch.
    deadline = time.monotonic() + 20
    while boot_fails(cluster) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert boot_fails(cluster) == 2  # replaced once, then given up on
