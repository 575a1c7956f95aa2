"""The node health gate against a REAL local UltraCluster: SlurmJobOperator runs the train job with the
gate on 2 static nodes (real sbatch and srun), the twin's neuron-ls and fi_info stand-ins at their real
paths. With the twin's `efa-unhealthy` fault on one node (its instance only), the gate fails before
training, the task drains that node over SSH with the check's reason, the twin's clustermgtd replaces
it (a new instance), and the resubmitted job passes the gate on both nodes, trains, and results.json
holds each node's checks: one node lost. With `neuron-unhealthy` bound to a node for good
(`NODE:always`), the replacement fails the gate again and the task fails naming the node, lost twice.

Run (root; about 3 minutes): .venvs/airflow/bin/python -m pytest -q tests/integration/test_health_gate_slurm.py
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures_localcluster import LOCALCLUSTER_PYTHON, wait_until_gone
from tests.integration.test_auto_resume_slurm import DATA_DIR, REPO, RUNTIME_READY, TRAINING_PYTHON, Store
from tests.integration.test_slurm_side import make_cluster, wait_for_fleet

pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(
    not RUNTIME_READY, reason="needs root, Slurm, sshd, .venvs/training and the local dataset")]

NAME = "healthgate"


@pytest.fixture
def cluster(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch):
    make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, NAME, {}, static=2)
    cluster_dir = uc_home / "clusters" / NAME
    runtime = json.loads((cluster_dir / "runtime.json").read_text())
    yield SimpleNamespace(dir=cluster_dir, fsx=Path(runtime["shared_dirs"]["/fsx"]),
                          nodes=sorted(n["name"] for n in runtime["nodes"]),
                          head=wait_for_fleet(SimpleNamespace(name=NAME), num_nodes=2)["head_node"])
    pcluster("delete-cluster", "-n", NAME)
    wait_until_gone(uc_env, NAME, timeout=120)


def fault(cluster, knob: str, *targets: str) -> None:
    """Set a node fault on the running cluster, as `python -m localcluster.runtime faults` does."""
    done = subprocess.run([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", "faults", str(cluster.dir), knob,
                           *targets], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def slurmctld_log(cluster) -> str:
    return (cluster.dir / "log" / "slurmctld.log").read_text(errors="replace")


def train(cluster, run_id: str, auto_resume_attempts: int = 2):
    from ultracluster.operators.slurm import SlurmJobOperator

    job_dir = f"/fsx/jobs/{run_id}"
    op = SlurmJobOperator(
        task_id="train", head_node=cluster.head, job_dir=job_dir, num_nodes=2,
        job_env={"MODEL_SIZE": "tiny", "BATCH_SIZE": "8", "WARMUP_STEPS": "1", "TORCH_NUM_THREADS": "1",
                 "GRAD_ACCUM_USTEPS": "2", "SCALING_MODE": "strong", "MAX_STEPS": "4", "STEPS_PER_CKPT": "10",
                 "DATA_DIR": str(DATA_DIR), "TRAINING_PYTHON": str(TRAINING_PYTHON),
                 "COMPILE_CACHE_DIR": f"{job_dir}/compile_cache"},
        training_files_dir=str(REPO / "include" / "training"), deferrable=False, poll_interval=1,
        auto_resume_attempts=auto_resume_attempts, node_replacements=1, resume_fleet_timeout=240,
        pcluster_conn_id="pcluster_default", region_name="us-east-1", health_gate="trn1.32xlarge")
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=run_id, task_id="train", map_index=-1,
                         xcom_push=lambda **_: None)
    return op.execute({"ti": ti, "task_state_store": Store()})


def test_the_gate_drains_an_unhealthy_node_until_it_is_replaced_then_records_both(cluster, capsys):
    from airflow.sdk.exceptions import AirflowFailException

    from tests.training.support import validate_results

    # One EFA device missing on one node's instance: drained, replaced, and the job resubmitted; on
    # the new instance both nodes pass, and results.json holds each node's checks.
    sick, well = cluster.nodes
    fault(cluster, "efa-unhealthy", sick)
    result = train(cluster, "gate-replaced")
    out = "".join(capsys.readouterr())
    reason = "UC health check failed: efa (found 7 of 8 devices)"
    assert f"Drained {sick}: {reason}" in out and f"  {well}: healthy [efa=8, neuron=16]" in out
    assert result["state"] == "COMPLETED" and result["node_health"]["healthy"], result
    assert sorted(result["node_health"]["nodes"]) == cluster.nodes
    assert result["auto_resume"]["nodes_lost"] == {sick: 1}, result["auto_resume"]
    [resume] = result["auto_resume"]["history"]
    assert resume["job_id"] == result["job_id"] != resume["failed_job_id"]
    results = json.loads((cluster.fsx / result["results_path"].removeprefix("/fsx/")).read_text())
    validate_results(results)
    section = results["results"]["parameters"]["Node health"]
    assert section["instance_type"] == "trn1.32xlarge"
    assert sorted((n["node"], n["checks"]["neuron"]["found"], n["checks"]["efa"]["found"]) for n in section["nodes"]) \
        == sorted((node, 16, 8) for node in cluster.nodes)
    log = slurmctld_log(cluster)
    assert f"update_node: node {sick} reason set to: {reason}" in log, log[-3000:]
    assert f"update_node: node {well} reason set to: UC" not in log
    assert not list((cluster.fsx / "jobs" / "gate-replaced").glob(f"output_{resume['failed_job_id']}"))

    # Unhealthy on every instance: the replacement fails the gate too, and the node is lost twice.
    fault(cluster, "neuron-unhealthy", f"{well}:always")
    with pytest.raises(AirflowFailException) as raised:
        train(cluster, "gate-lost")
    message = str(raised.value)
    assert message.startswith(f"Nodes lost past node_replacements=1: {well} (UC health check failed: neuron "
                              f"(found 15 of 16 devices)) lost 2 time(s)"), message
    assert sick not in message.splitlines()[0]
