"""Slurm side against a REAL local UltraCluster (pcluster-compatible CLI, moto, slurmctld/slurmd,
sshd head node): wait_for_fleet pins the real host key, download_data pulls from moto with curl on the
head node, SlurmJobOperator submits/streams/reattaches/fails/cancels real Slurm jobs, collect_results
uploads to moto. Only connections differ from production.

Run: .venvs/airflow/bin/python -m pytest tests/integration/test_slurm_side.py -q  (root; ~1-2 min)
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fixtures_localcluster import PCLUSTER_BIN, wait_for_status, wait_until_gone
from ultracluster.operators.slurm_job import STATE_KEY_JOB_ID

RUNTIME_READY = os.geteuid() == 0 and bool(shutil.which("slurmctld")) and Path("/usr/sbin/sshd").exists()
pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(not RUNTIME_READY, reason="needs root, Slurm, sshd")]

DATASET_KEY = ("training_datasets/bert_pretrain_wikicorpus_tokenized_hdf5/"
               "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128.tar")

# A stand-in run script honouring the training job contract (env vars, UC_PROGRESS, UC_RESULTS,
# output_<jobid>/ with per-node logs and results.json); the real one needs the training venv.
RUN_SCRIPT = r"""#!/bin/bash
set -u
out="$OUTPUT_ROOT/output_$SLURM_JOB_ID"
mkdir -p "$out/ckpt"
echo "rank $SLURM_PROCID on $(hostname) COMPILE_ONLY=${COMPILE_ONLY:-0}" > "$out/log_ph1_bf16_${SLURM_PROCID}_${SLURM_NNODES}"
if [ "$SLURM_PROCID" = 0 ]; then
  for i in 1 2 3; do
    echo "UC_PROGRESS step=$i total=3 loss=$((10 - i)).500000 lr=0.000100 throughput=1$i.00 eta_s=$((3 - i))"
    sleep "${STEP_SLEEP:-1}"
  done
  echo "checkpoint" > "$out/ckpt/ckpt_3.pt"
  cat > "$out/results.json" <<EOF
{"results": {"parameters": {"World size": $SLURM_NNODES, "Batch size": 8, "Gradient accumulation microsteps": 2,
 "Total steps": 3, "Scaling mode": "$SCALING_MODE"},
 "metrics": [{"MetricName": "Final loss", "MeasuredValue": 7.5, "Units": "-", "Timestamp": "t", "AdditionalData": ""},
             {"MetricName": "Average throughput", "MeasuredValue": 12.0, "Units": "seq/s", "Timestamp": "t", "AdditionalData": ""},
             {"MetricName": "Peak throughput", "MeasuredValue": 13.0, "Units": "seq/s", "Timestamp": "t", "AdditionalData": ""},
             {"MetricName": "Time to train", "MeasuredValue": 0.05, "Units": "minutes", "Timestamp": "t", "AdditionalData": ""}]}}
EOF
  echo "UC_RESULTS $out/results.json"
fi
if [ -n "${FAIL_WITH:-}" ]; then echo "UC_ERROR asked to fail"; exit "$FAIL_WITH"; fi
"""


class Store(dict):
    def set(self, key, value, **_):
        self[key] = value


def ctx(task_id: str, store: Store | None = None, run_id: str = "manual__it_1") -> dict:
    ti = SimpleNamespace(dag_id="trn1_bert_pretrain", run_id=run_id, task_id=task_id, map_index=-1,
                         xcom_push=lambda **_: None)  # collect_results persists its extra link
    return {"ti": ti, "task_state_store": store if store is not None else Store(), "outlet_events": OutletEvents()}


class OutletEvents(dict):
    def __missing__(self, key):
        self[key] = SimpleNamespace(extra={})
        return self[key]


@pytest.fixture
def cluster(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch):
    """A 2-static + 1-dynamic node cluster and the three Airflow connections pointing at it."""
    name = "slurmside"
    config = make_cluster_config(static=2, dynamic=1, tags={"local-ultracluster:provisioning-delay": "1"})
    code, created = pcluster("create-cluster", "-n", name, "-c", str(config))
    assert code == 0, created
    described = wait_for_status(uc_env, name, {"CREATE_COMPLETE", "CREATE_FAILED"}, timeout=240)
    assert described["clusterStatus"] == "CREATE_COMPLETE", described
    cli_env = {k: v for k, v in uc_env.items() if k.startswith(("AWS_", "LOCAL_UC", "LOCAL_ULTRACLUSTER"))}
    endpoint = uc_env["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", json.dumps(
        {"conn_type": "pcluster", "extra": {"binary": str(PCLUSTER_BIN), "region": "us-east-1", "env": cli_env}}))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(
        {"conn_type": "aws", "login": "testing", "password": "testing",
         "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}))
    monkeypatch.setenv("AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE", json.dumps(
        {"conn_type": "ssh", "login": "ubuntu",  # Image.Os ubuntu2204's default user
         "port": int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
         "extra": {"key_file": str(uc_home / "keys" / "ultracluster-local")}}))
    yield SimpleNamespace(name=name, home=uc_home, env=uc_env, endpoint=endpoint)
    pcluster("delete-cluster", "-n", name)
    wait_until_gone(uc_env, name, timeout=120)  # then uc_home checks that nothing is left running


def wait_for_fleet(cluster, num_nodes: int, partition: str | None = None) -> dict:
    from ultracluster.triggers.fleet import ComputeFleetTrigger

    trigger = ComputeFleetTrigger(cluster_name=cluster.name, num_nodes=num_nodes, partition=partition,
                                  pcluster_conn_id="pcluster_default", ssh_conn_id="ultracluster_head_node",
                                  ssh_port=int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")), poke_interval=1)

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), timeout=180))


def test_slurm_side_end_to_end(cluster, tmp_path):
    import boto3

    from airflow.sdk.exceptions import AirflowException

    from ultracluster import remote_commands as rc
    from ultracluster.hooks.head_node import HeadNodeHook, HostKeyMismatchError
    from ultracluster.hooks.slurm import SlurmHook
    from ultracluster.operators.dataset import DownloadDatasetOperator
    from ultracluster.run.names import safe_run_id, slurm_job_name
    from ultracluster.operators.results import CollectResultsOperator
    from ultracluster.operators.slurm import SlurmJobOperator

    # wait_for_fleet: real describe-cluster + real sinfo; the pinned key is the cluster's sshd key
    event = wait_for_fleet(cluster, num_nodes=2)
    assert event["status"] == "success", event
    head = event["head_node"]
    pub = (cluster.home / "clusters" / cluster.name / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert head["host_key"] == " ".join(pub) and head["address"].startswith("127.100.")
    assert head["partition"] == "compute1"
    too_many = wait_for_fleet(cluster, num_nodes=4)
    assert (too_many["status"], too_many["reason"]) == ("failed", "not_enough_nodes")
    assert "Not enough usable nodes" in too_many["message"]

    # a wrong host key is refused by the real head node
    wrong = dict(head, host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMTV0nBQVJCoQRcHDIBnyHP9DpoIIr9SLjgyYCZAb4u")
    with pytest.raises(HostKeyMismatchError):
        HeadNodeHook(head_node=wrong).run(rc.sinfo())

    # download_data from moto with curl on the head node; the second run skips
    files = {f"wiki_training_{i}.hdf5": os.urandom(1024) for i in range(2)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        manifest = "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in files.items()).encode()
        for name, data in {**files, "SHA256SUMS": manifest}.items():
            info = tarfile.TarInfo(f"bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    s3 = boto3.client("s3", endpoint_url=cluster.endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.put_object(Bucket="neuron-s3", Key=DATASET_KEY, Body=buffer.getvalue())
    download = DownloadDatasetOperator(task_id="download_data", head_node=head,
                                       dataset_s3_uri=f"s3://neuron-s3/{DATASET_KEY}", data_dir="/fsx/data",
                                       expected_min_files=2)
    first = download.execute(ctx("download_data"))
    assert first == {"data_dir": "/fsx/data/bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128", "files": 2, "skipped": False}
    assert download.execute(ctx("download_data"))["skipped"] is True

    # parallel_compile without TRAINING_PYTHON: neuron_parallel_compile (in the Neuron venv) is not where
    # the job looks -> COMPILE_ONLY=1 when the caller opts in (launcher_fallback_env); else it refuses.
    training = tmp_path / "training"
    training.mkdir()
    (training / "run_dp_bert_large_hf_pretrain_bf16_s128.sh").write_text(RUN_SCRIPT)
    env = {"SCALING_MODE": "strong", "DATA_DIR": first["data_dir"], "STEP_SLEEP": "0"}
    compile_op = SlurmJobOperator(task_id="parallel_compile", head_node=head, job_dir="/fsx/jobs/compile",
                                  num_nodes=2, job_env=env, launcher="neuron_parallel_compile",
                                  launcher_fallback_env={"COMPILE_ONLY": "1"},
                                  training_files_dir=str(training), deferrable=False, poll_interval=1)
    compiled = compile_op.execute(ctx("parallel_compile"))
    assert compiled["state"] == "COMPLETED"
    assert compiled["launch"] == {"mode": "compile_only", "path": None}
    from airflow.sdk.exceptions import AirflowFailException

    strict = SlurmJobOperator(task_id="parallel_compile", head_node=head, job_dir="/fsx/jobs/strict",
                              num_nodes=1, job_env=env, launcher="neuron_parallel_compile",
                              training_files_dir=str(training), deferrable=False, poll_interval=1)
    with pytest.raises(AirflowFailException, match="UC_ERROR.*neuron_parallel_compile not found in /opt/aws/neuron/bin"):
        strict.execute(ctx("parallel_compile", run_id="manual__strict"))
    slurm = SlurmHook(head_node=head)
    assert "COMPILE_ONLY=1" in slurm.tail_log(compiled["output_dir"] + "/log_ph1_bf16_0_2")
    assert "neuron_parallel_compile not found" in slurm.tail_log(compiled["log_path"])

    # train: progress streamed, result shape; a retry of the same task reattaches (no 2nd sbatch)
    store = Store()
    train_op = SlurmJobOperator(task_id="train", head_node=head, job_dir="/fsx/jobs/train", num_nodes=2,
                                job_env=env, training_files_dir=str(training), deferrable=False, poll_interval=1)
    trained = train_op.execute(ctx("train", store))
    assert trained["state"] == "COMPLETED" and trained["exit_code"] == 0
    assert trained["results_path"] == f"{trained['output_dir']}/results.json"
    again = train_op.execute(ctx("train", store))
    assert again["job_id"] == trained["job_id"]
    same_name = slurm.squeue_by_name(slurm_job_name("trn1_bert_pretrain", "manual__it_1", "train"))
    assert [j.job_id for j in same_name] == [trained["job_id"]]

    # A stored job id that now names another job (a rebuilt cluster restarts ids at 1; here the
    # compile job in a shared job dir) is not taken for this task's job: a new one is submitted.
    assert slurm.squeue_job("999999") == []  # an id slurmctld does not know
    compile_name = slurm_job_name("trn1_bert_pretrain", "manual__it_1", "parallel_compile")
    name_marker = rc.job_file("/fsx/jobs/compile", compiled["job_id"], "name")
    assert slurm.head_node_hook.check(rc.read_file(name_marker)).stdout.strip() == compile_name
    clash = Store({STATE_KEY_JOB_ID: compiled["job_id"]})
    retrain = SlurmJobOperator(task_id="train", head_node=head, job_dir="/fsx/jobs/compile", num_nodes=2,
                               job_env=env, training_files_dir=str(training), deferrable=False, poll_interval=1)
    rerun = retrain.execute(ctx("train", clash, run_id="manual__it_2"))
    assert rerun["job_id"] != compiled["job_id"] and rerun["state"] == "COMPLETED"
    assert clash[STATE_KEY_JOB_ID] == rerun["job_id"]

    # collect_results: upload to moto through presigned PUT URLs and curl on the head node
    collect = CollectResultsOperator(task_id="collect_results", head_node=head, train=trained,
                                     artifacts_s3_uri="s3://ultracluster-artifacts", num_nodes=2)
    metrics = collect.execute(ctx("collect_results"))
    assert metrics["final_loss"] == 7.5 and metrics["scaling_mode"] == "strong" and metrics["global_batch"] == 32
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ultracluster-artifacts")["Contents"]}
    prefix = f"results/trn1_bert_pretrain/{safe_run_id('manual__it_1')}/"
    assert {prefix + "results.json", prefix + "log_ph1_bf16_0_2", prefix + "log_ph1_bf16_1_2",
            prefix + "ckpt/ckpt_3.pt", prefix + f"slurm-{trained['job_id']}.out"} <= keys

    # a failing job: state, exit code and the log tail in the error
    failing = SlurmJobOperator(task_id="train_fail", head_node=head, job_dir="/fsx/jobs/fail", num_nodes=1,
                               job_env={**env, "FAIL_WITH": "3"}, training_files_dir=str(training),
                               deferrable=False, poll_interval=1)
    with pytest.raises(AirflowException) as error:
        failing.execute(ctx("train_fail"))
    assert "FAILED" in str(error.value) and "exit code 3" in str(error.value) and "UC_ERROR asked to fail" in str(error.value)

    # on_kill cancels the running job
    slow = SlurmJobOperator(task_id="train_slow", head_node=head, job_dir="/fsx/jobs/slow", num_nodes=1,
                            job_env={**env, "STEP_SLEEP": "60"}, training_files_dir=str(training), poll_interval=1)
    job = slow.job(ctx("train_slow"))
    job_id = job.submit("manual__it_1")
    slow._running = (job, job_id)  # the worker-side wait on it
    slow.on_kill()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = slurm.job_status(job_id, "/fsx/jobs/slow")
        if status.terminal:
            break
        time.sleep(1)
    assert status.state == "CANCELLED", status

    # The budget guard: the second progress line (the first one's ETA includes warm-up) projects
    # the run past max_cost_usd ($1 at $1 a second, the cluster billing since now): the job is
    # cancelled and the task fails at once.
    from datetime import datetime, timezone

    from airflow.sdk.exceptions import AirflowFailException

    guarded = SlurmJobOperator(task_id="train_budget", head_node=head, job_dir="/fsx/jobs/budget", num_nodes=1,
                               job_env={**env, "STEP_SLEEP": "30"}, training_files_dir=str(training),
                               deferrable=False, poll_interval=1,
                               budget={"max_usd": 1.0, "usd_per_hour": 3600.0,
                                       "since": datetime.now(timezone.utc).isoformat()})
    budget_store = Store()
    with pytest.raises(AirflowFailException, match=r"budget guard: projected cost \$[0-9.]+ .* exceeds "
                                                   r"max_cost_usd \$1\.00; job \d+ cancelled"):
        guarded.execute(ctx("train_budget", budget_store))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = slurm.job_status(budget_store[STATE_KEY_JOB_ID], "/fsx/jobs/budget")
        if status.terminal:
            break
        time.sleep(1)
    assert status.state == "CANCELLED", status


def make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, name: str, tags: dict[str, str],
                 static: int = 2, dynamic: int = 0, mutate=None):
    config = make_cluster_config(static=static, dynamic=dynamic, mutate=mutate,
                                 tags={"local-ultracluster:provisioning-delay": "1", **tags})
    code, created = pcluster("create-cluster", "-n", name, "-c", str(config))
    assert code == 0, created
    described = wait_for_status(uc_env, name, {"CREATE_COMPLETE", "CREATE_FAILED"}, timeout=240)
    assert described["clusterStatus"] == "CREATE_COMPLETE", described
    cli_env = {k: v for k, v in uc_env.items() if k.startswith(("AWS_", "LOCAL_UC", "LOCAL_ULTRACLUSTER"))}
    monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", json.dumps(
        {"conn_type": "pcluster", "extra": {"binary": str(PCLUSTER_BIN), "region": "us-east-1", "env": cli_env}}))
    monkeypatch.setenv("AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE", json.dumps(
        {"conn_type": "ssh", "login": "ubuntu",  # Image.Os ubuntu2204's default user
         "port": int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
         "extra": {"key_file": str(uc_home / "keys" / "ultracluster-local")}}))
    return SimpleNamespace(name=name, home=uc_home, env=uc_env)


def test_trigger_rides_out_a_head_node_ssh_outage(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch,
                                                  tmp_path, capsys):
    """The job's trigger meets an outage of the head node's sshd and carries on once it is back.

    No timing: the job runs until the test releases it, the outage starts once the job is submitted
    and lasts until the test has seen the trigger fail to reach the head node (the fault reports when
    sshd went down and came back, run/faults/ssh-outage.json)."""
    import subprocess

    from tests.fixtures_localcluster import LOCALCLUSTER_PYTHON
    from ultracluster import remote_commands as rc
    from ultracluster.hooks.slurm import SlurmHook
    from ultracluster.triggers.slurm import SlurmJobTrigger

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, "outage", {})
    cluster_dir = uc_home / "clusters" / "outage"
    fsx = Path(json.loads((cluster_dir / "runtime.json").read_text())["shared_dirs"]["/fsx"])
    report, release = cluster_dir / "run" / "faults" / "ssh-outage.json", tmp_path / "release-sshd"
    outage = None
    try:
        head = wait_for_fleet(cluster, num_nodes=1)["head_node"]
        slurm = SlurmHook(head_node=head)
        slurm.head_node_hook.check(rc.make_dirs("/fsx/jobs/outage"))
        (tmp_path / "job.sh").write_text("#!/bin/bash\n"
                                         "while [ ! -e /fsx/jobs/outage/release ]; do sleep 0.2; done\necho done\n")
        slurm.head_node_hook.put_file(str(tmp_path / "job.sh"), "/fsx/jobs/outage/job.sh", mode=0o755)
        job_id = slurm.sbatch(job_dir="/fsx/jobs/outage", script_path="/fsx/jobs/outage/job.sh", num_nodes=1,
                              job_name="uc.outage", comment="outage test", job_env={}, exclusive=False)
        outage = subprocess.Popen([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime.agent", str(cluster_dir),
                                   "ssh-outage-now", "--release", str(release)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        trigger = SlurmJobTrigger(head_node=head, ssh_conn_id="ultracluster_head_node", job_id=job_id,
                                  job_dir="/fsx/jobs/outage", log_path=f"/fsx/jobs/outage/slurm-{job_id}.out",
                                  poll_interval=1, outage_timeout=600)
        seen: list[str] = []

        def reported(state: str) -> bool:
            return report.exists() and json.loads(report.read_text())["state"] == state

        async def until(condition, what: str) -> None:
            while not condition():
                assert outage.poll() is None or reported("up"), f"the outage ended early: {outage.stdout.read()}"
                seen.append("".join(capsys.readouterr()))  # the trigger logs to stdout (or stderr)
                await asyncio.sleep(0.2)
            seen.append(f"<{what}>")

        async def drive() -> dict:
            await until(lambda: reported("down"), "sshd down")
            first = asyncio.ensure_future(anext(trigger.run()))
            await until(lambda: "Head node unreachable" in "".join(seen), "trigger met the outage")
            release.touch()
            await until(lambda: reported("up"), "sshd up")
            (fsx / "jobs" / "outage" / "release").touch()  # the job ends only after sshd is back
            return (await asyncio.wait_for(first, timeout=300)).payload

        # Each step waits for the one before; the bound only keeps a broken run from hanging.
        final = asyncio.run(asyncio.wait_for(drive(), timeout=900))
        assert final["status"] == "success" and final["state"] == "COMPLETED", final
        times = json.loads(report.read_text())
        assert times["state"] == "up" and times["down_at"] < times["up_at"]
        assert outage.wait(timeout=60) == 0
    finally:
        release.touch()
        if outage is not None and outage.poll() is None:
            outage.wait(timeout=60)
        pcluster("delete-cluster", "-n", "outage")
        wait_until_gone(uc_env, "outage", timeout=120)


def test_node_failure_fails_the_task_with_node_fail(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch,
                                                    tmp_path):
    from airflow.sdk.exceptions import AirflowException

    from ultracluster.operators.slurm import SlurmJobOperator

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, "nodekill",
                           {"local-ultracluster:kill-node-after": "3"})
    try:
        event = wait_for_fleet(cluster, num_nodes=1)
        assert event["status"] == "success", event
        training = tmp_path / "training"
        training.mkdir()
        (training / "run_dp_bert_large_hf_pretrain_bf16_s128.sh").write_text(RUN_SCRIPT)
        op = SlurmJobOperator(task_id="train", head_node=event["head_node"], job_dir="/fsx/jobs/nodekill",
                              num_nodes=1, job_env={"SCALING_MODE": "strong", "STEP_SLEEP": "60"},
                              training_files_dir=str(training), deferrable=False, poll_interval=1)
        with pytest.raises(AirflowException) as error:
            op.execute(ctx("train", run_id="manual__nodekill"))
        assert "NODE_FAIL" in str(error.value), str(error.value)
    finally:
        pcluster("delete-cluster", "-n", "nodekill")
        wait_until_gone(uc_env, "nodekill", timeout=120)


def test_final_state_from_sacct_when_accounting_exists(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch,
                                                       tmp_path):
    """With slurmdbd (Scheduling.SlurmSettings.Database) sacct answers; the parser reads its real output.

    Set UC_CAPTURE_DIR to also write the raw outputs (how tests/fixtures/slurm/sacct_*.out were made).
    """
    from ultracluster import remote_commands as rc
    from ultracluster.hooks.slurm import SlurmHook, status_from_sacct
    from ultracluster.parsers import slurm as parse

    config = make_cluster_config(static=1, dynamic=0, accounting=True,
                                 tags={"local-ultracluster:provisioning-delay": "1"})
    code, created = pcluster("create-cluster", "-n", "acct", "-c", str(config))
    assert code == 0, created
    try:
        described = wait_for_status(uc_env, "acct", {"CREATE_COMPLETE", "CREATE_FAILED"}, timeout=240)
        assert described["clusterStatus"] == "CREATE_COMPLETE", described
        cluster = SimpleNamespace(name="acct", home=uc_home, env=uc_env)
        cli_env = {k: v for k, v in uc_env.items() if k.startswith(("AWS_", "LOCAL_UC", "LOCAL_ULTRACLUSTER"))}
        monkeypatch.setenv("AIRFLOW_CONN_PCLUSTER_DEFAULT", json.dumps(
            {"conn_type": "pcluster", "extra": {"binary": str(PCLUSTER_BIN), "region": "us-east-1", "env": cli_env}}))
        monkeypatch.setenv("AIRFLOW_CONN_ULTRACLUSTER_HEAD_NODE", json.dumps(
            {"conn_type": "ssh", "login": "ubuntu",  # Image.Os ubuntu2204's default user
             "port": int(os.environ.get("LOCAL_UC_SSH_PORT", "2222")),
             "extra": {"key_file": str(uc_home / "keys" / "ultracluster-local")}}))
        event = wait_for_fleet(cluster, num_nodes=1)
        assert event["status"] == "success", event
        slurm = SlurmHook(head_node=event["head_node"])
        node = slurm.head_node_hook
        node.check(rc.make_dirs("/fsx/jobs/acct"))
        (tmp_path / "fail.sh").write_text("#!/bin/bash\necho failing\nexit 3\n")
        node.put_file(str(tmp_path / "fail.sh"), "/fsx/jobs/acct/fail.sh", mode=0o755)
        job_id = slurm.sbatch(job_dir="/fsx/jobs/acct", script_path="/fsx/jobs/acct/fail.sh", num_nodes=1,
                              job_name="uc.acct", comment="accounting test", job_env={})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not slurm.job_status(job_id, "/fsx/jobs/acct").terminal:
            time.sleep(1)
        # slurmdbd records the end a moment after slurmctld: poll sacct until it has the final state.
        deadline = time.monotonic() + 60
        while True:
            result = node.run(rc.sacct_job(job_id))
            status = status_from_sacct(job_id, result)
            if (status and status.terminal) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert result.ok and not parse.is_accounting_disabled(result.stdout + result.stderr), result
        assert status is not None and (status.state, status.exit_code, status.source) == ("FAILED", 3, "sacct"), result
        # Filtered by name, sacct lists the id only for a job of that name (ids repeat across clusters).
        # The name-filtered query sees the job a moment after the id query does (slurmdbd writes in steps).
        deadline = time.monotonic() + 30
        while (by_name := status_from_sacct(job_id, node.run(rc.sacct_job(job_id, "uc.acct")), "uc.acct")) is None:
            assert time.monotonic() < deadline, "sacct --name never listed the job"
            time.sleep(1)
        assert by_name.state == "FAILED"
        assert status_from_sacct(job_id, node.run(rc.sacct_job(job_id, "uc.other")), "uc.other") is None
        # What a run on an existing cluster is billed from (collect_results): its jobs' elapsed x nodes.
        today = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 86400))
        usage = slurm.sacct_usage(["uc.acct", "uc.other"], today)
        assert [(j["job_id"], j["name"], j["state"], j["nodes"]) for j in usage] == [(job_id, "uc.acct", "FAILED", 1)]
        assert usage[0]["elapsed_s"] >= 0
        if os.environ.get("UC_CAPTURE_DIR"):
            capture = Path(os.environ["UC_CAPTURE_DIR"])
            (capture / "sacct_failed.cmd").write_text(rc.sacct_job(job_id).shell + "\n")
            (capture / "sacct_failed.out").write_text(result.stdout)
            (capture / "sacct_usage.cmd").write_text(rc.sacct_usage(["uc.acct"], today).shell + "\n")
            (capture / "sacct_usage.out").write_text(node.run(rc.sacct_usage(["uc.acct"], today)).stdout)
    finally:
        pcluster("delete-cluster", "-n", "acct")
        wait_until_gone(uc_env, "acct", timeout=120)


def test_a_failed_runs_files_reach_s3_and_a_later_run_gets_its_checkpoint(uc_home, uc_env, make_cluster_config,
                                                                          pcluster, monkeypatch, tmp_path):
    """save_failure_artifacts after a real failed Slurm job, and restore_checkpoint (resume_from)
    pulling that saved checkpoint back onto the cluster's shared storage: head node <-> moto by curl."""
    import boto3

    from airflow.sdk.exceptions import AirflowException

    from ultracluster.hooks.slurm import SlurmHook
    from ultracluster.operators.checkpoint import RestoreCheckpointOperator
    from ultracluster.run.names import safe_run_id
    from ultracluster.operators.failure_artifacts import SaveFailureArtifactsOperator
    from ultracluster.operators.slurm import SlurmJobOperator

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, "failsave", {})
    endpoint = uc_env["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(
        {"conn_type": "aws", "login": "testing", "password": "testing",
         "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}))
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        event = wait_for_fleet(cluster, num_nodes=1)
        assert event["status"] == "success", event
        head = event["head_node"]
        training = tmp_path / "training"
        training.mkdir()
        (training / "run_dp_bert_large_hf_pretrain_bf16_s128.sh").write_text(RUN_SCRIPT)
        job_dir = "/fsx/ultracluster/trn1_bert_pretrain/failsave"
        failing = SlurmJobOperator(task_id="train", head_node=head, job_dir=job_dir, num_nodes=1,
                                   job_env={"SCALING_MODE": "strong", "STEP_SLEEP": "0", "FAIL_WITH": "3"},
                                   training_files_dir=str(training), deferrable=False, poll_interval=1)
        store = Store()
        with pytest.raises(AirflowException, match="UC_ERROR asked to fail"):
            failing.execute(ctx("train", store, run_id="manual__failsave"))
        job_id = store[STATE_KEY_JOB_ID]

        # A checkpoint restored by restore_checkpoint sits in the job dir too: it is not copied back.
        earlier = "runs/results/trn1_bert_pretrain/earlier/checkpoints/ckpt_2.pt"
        s3.put_object(Bucket="ultracluster-artifacts", Key=earlier, Body=b"saved by an earlier run")
        restored = RestoreCheckpointOperator(
            task_id="restore_checkpoint", head_node=head, resume_from="s3://ultracluster-artifacts/runs/results/",
            destination_dir=f"{job_dir}/.resume").execute(ctx("restore_checkpoint", run_id="manual__failsave"))
        assert restored["path"] == f"{job_dir}/.resume/ckpt_2.pt" and restored["step"] == 2
        assert SlurmHook(head_node=head).tail_log(restored["path"]).strip() == "saved by an earlier run"

        saved = SaveFailureArtifactsOperator(
            task_id="save_failure_artifacts", head_node=head, job_dir=job_dir, collected=None,
            artifacts_s3_uri="s3://ultracluster-artifacts/runs").execute(ctx("save_failure_artifacts",
                                                                            run_id="manual__failsave"))
        prefix = f"runs/failed/trn1_bert_pretrain/{safe_run_id('manual__failsave')}/"
        assert saved["artifacts_uri"] == f"s3://ultracluster-artifacts/{prefix}"
        keys = {o["Key"][len(prefix):] for o in s3.list_objects_v2(Bucket="ultracluster-artifacts",
                                                                     Prefix=prefix)["Contents"]}
        assert {f"slurm-{job_id}.out", f"output_{job_id}/ckpt/ckpt_3.pt", f"output_{job_id}/results.json",
                f"output_{job_id}/log_ph1_bf16_0_1"} <= keys, keys
        assert not any(".resume" in key for key in keys)
        log = s3.get_object(Bucket="ultracluster-artifacts", Key=f"{prefix}slurm-{job_id}.out")["Body"].read()
        assert b"UC_ERROR asked to fail" in log

        # The later run's resume_from may name that failed run's prefix: its newest checkpoint.
        again = RestoreCheckpointOperator(
            task_id="restore_checkpoint", head_node=head, resume_from=f"s3://ultracluster-artifacts/{prefix}",
            destination_dir=f"{job_dir}/later").execute(ctx("restore_checkpoint", run_id="manual__later"))
        assert again["step"] == 3 and again["s3_uri"].endswith(f"output_{job_id}/ckpt/ckpt_3.pt")
    finally:
        pcluster("delete-cluster", "-n", "failsave")
        wait_until_gone(uc_env, "failsave", timeout=120)
