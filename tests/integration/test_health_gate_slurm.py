"""The node health gate against a REAL local UltraCluster: SlurmJobOperator runs the train job with the
gate on 2 nodes (real sbatch and srun). Healthy (the twin's neuron-ls stand-in at its real path), the
tiny BERT trains and results.json holds each node's checks. With a neuron-ls that finds one device too
few on one node, the gate fails, the job ends with the gate's code before training, and the task
drains that node over SSH (sudo scontrol, as ParallelCluster's default user) with the check's reason,
then fails naming it (auto-resume off: the replacement is the fleet wait's).

The stand-ins the job names (UC_HEALTH_FI_INFO, UC_HEALTH_NEURON_LS) live on /fsx: the twin has no
fi_info yet, and a device short on one node is this test's own, whatever faults the twin models.

Run (root; about a minute): .venvs/airflow/bin/python -m pytest -q tests/integration/test_health_gate_slurm.py
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures_localcluster import wait_until_gone
from tests.integration.test_auto_resume_slurm import DATA_DIR, REPO, RUNTIME_READY, TRAINING_PYTHON, Store
from tests.integration.test_slurm_side import make_cluster, wait_for_fleet

pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(
    not RUNTIME_READY, reason="needs root, Slurm, sshd, .venvs/training and the local dataset")]

NAME = "healthgate"
FI_INFO = "".join(f"provider: efa\n    fabric: efa\n    domain: rdmap{16 + i}s27-rdm\n    type: FI_EP_RDM\n"
                  for i in range(8))


@pytest.fixture
def cluster(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch):
    make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, NAME, {}, static=2)
    cluster_dir = uc_home / "clusters" / NAME
    runtime = json.loads((cluster_dir / "runtime.json").read_text())
    fsx = Path(runtime["shared_dirs"]["/fsx"])
    tools = fsx / "tools"
    tools.mkdir(mode=0o755)
    (tools / "fi_info").write_text(f"#!/bin/sh\ncat <<'EOF'\n{FI_INFO}EOF\n")
    nodes = [n["name"] for n in runtime["nodes"]]
    # neuron-ls --json-output with one device fewer on the first node.
    (tools / "neuron-ls").write_text(f"""#!/bin/bash
devices=16; [ "$SLURMD_NODENAME" = {nodes[0]} ] && devices=15
sep=""; printf '['
for ((i = 0; i < devices; i++)); do printf '%s{{"neuron_device": %d}}' "$sep" $i; sep=", "; done; echo ']'
""")
    for tool in ("fi_info", "neuron-ls"):
        (tools / tool).chmod(0o755)
    yield SimpleNamespace(dir=cluster_dir, fsx=fsx, nodes=nodes,
                          head=wait_for_fleet(SimpleNamespace(name=NAME), num_nodes=2)["head_node"])
    pcluster("delete-cluster", "-n", NAME)
    wait_until_gone(uc_env, NAME, timeout=120)


def slurmctld_log(cluster) -> str:
    return (cluster.dir / "log" / "slurmctld.log").read_text(errors="replace")


def train(cluster, run_id: str, **job_env: str):
    from ultracluster.operators.slurm import SlurmJobOperator

    job_dir = f"/fsx/jobs/{run_id}"
    op = SlurmJobOperator(
        task_id="train", head_node=cluster.head, job_dir=job_dir, num_nodes=2,
        job_env={"MODEL_SIZE": "tiny", "BATCH_SIZE": "8", "WARMUP_STEPS": "1", "TORCH_NUM_THREADS": "1",
                 "GRAD_ACCUM_USTEPS": "2", "SCALING_MODE": "strong", "MAX_STEPS": "4", "STEPS_PER_CKPT": "10",
                 "DATA_DIR": str(DATA_DIR), "TRAINING_PYTHON": str(TRAINING_PYTHON),
                 "COMPILE_CACHE_DIR": f"{job_dir}/compile_cache", "UC_HEALTH_FI_INFO": "/fsx/tools/fi_info",
                 **job_env},
        training_files_dir=str(REPO / "include" / "training"), deferrable=False, poll_interval=1,
        auto_resume_attempts=0, health_gate="trn1.32xlarge")
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=run_id, task_id="train", map_index=-1,
                         xcom_push=lambda **_: None)
    return op.execute({"ti": ti, "task_state_store": Store()})


def test_a_healthy_run_records_its_nodes_and_an_unhealthy_node_is_drained_with_the_check(cluster, capsys):
    from airflow.sdk.exceptions import AirflowFailException

    from tests.training.support import validate_results

    result = train(cluster, "gate-well")
    assert result["state"] == "COMPLETED"
    assert result["node_health"]["healthy"] and sorted(result["node_health"]["nodes"]) == sorted(cluster.nodes)
    results = json.loads((cluster.fsx / result["results_path"].removeprefix("/fsx/")).read_text())
    validate_results(results)
    section = results["results"]["parameters"]["Node health"]
    assert section["instance_type"] == "trn1.32xlarge"
    assert sorted((n["node"], n["checks"]["neuron"]["found"], n["checks"]["efa"]["found"]) for n in section["nodes"]) \
        == sorted((node, 16, 8) for node in cluster.nodes)
    capsys.readouterr()

    sick, well = cluster.nodes
    with pytest.raises(AirflowFailException) as raised:
        train(cluster, "gate-sick", UC_HEALTH_NEURON_LS="/fsx/tools/neuron-ls")
    reason = "UC health check failed: neuron (found 15 of 16 devices)"
    message = str(raised.value)
    assert f"{sick} ({reason}); drained" in message and "auto_resume_attempts=0" in message
    assert well not in message.split("drained")[0]
    out = "".join(capsys.readouterr())
    assert f"  {well}: healthy [efa=8, neuron=16]" in out and f"  {sick}: neuron (found 15 of 16 devices)" in out
    assert f"Drained {sick}: {reason}" in out
    # slurmctld did it (its log: the state may move on once ParallelCluster replaces the node).
    log = slurmctld_log(cluster)
    assert f"update_node: node {sick} reason set to: {reason}" in log, log[-3000:]
    assert f"update_node: node {well} reason set to" not in log
    job_dir = cluster.fsx / "jobs" / "gate-sick"
    assert not list(job_dir.glob("output_*"))  # the gate stopped the job before training
