"""The training job on a real 2-node Slurm cluster of the local UltraCluster, submitted as the product does:

    sbatch --exclusive --nodes 2 --output <jobdir>/slurm-%j.out --export=ALL,... \
           --wrap "/opt/slurm/bin/srun <jobdir>/run_dp_bert_large_hf_pretrain_bf16_s128.sh"

from a job directory on the cluster's /fsx. Every test here needs the cluster (fixture two_node_cluster).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.training.support import (REPO, TINY_ENV, TRAINING_DIR, TRAINING_PYTHON, metric_values,
                                    processes_mentioning, progress_lines, results_path, validate_results)

LOCALCLUSTER_PYTHON = REPO / ".venvs" / "localcluster" / "bin" / "python"
# Slots of their own (a developer's `make up` uses 1-99, other test suites 200-254).
CLUSTER_ENV = {"LOCAL_UC_SLOT_MIN": "180", "LOCAL_UC_SLOT_MAX": "199", "LOCAL_UC_PORT_BASE": "20000",
               "LOCAL_UC_DB_PORT": "20090"}
# On the nodes Slurm's programs are in /opt/slurm/bin only (a ParallelCluster node; docs/local-cluster.md).
SRUN = "/opt/slurm/bin/srun"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}

pytestmark = [
    pytest.mark.training,
    pytest.mark.localcluster,
    pytest.mark.skipif(os.geteuid() != 0 or not LOCALCLUSTER_PYTHON.exists() or not shutil.which("slurmctld"),
                       reason="needs root, the localcluster venv and Slurm"),
]


@dataclass
class SlurmCluster:
    dir: Path
    runtime: dict
    fsx: Path  # the host path of the cluster's /fsx

    def slurm(self, *args: str, user: str | None = None) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = self.runtime["slurm"]["conf"]
        # As the cluster user, the way the product submits over SSH.
        prefix = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={env['SLURM_CONF']}"] if user else []
        done = subprocess.run(prefix + list(args), env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    def job_field(self, job_id: str, field: str) -> str:
        for token in self.slurm("scontrol", "show", "job", job_id).split():
            if token.startswith(field + "="):
                return token.split("=", 1)[1]
        raise AssertionError(f"{field} not shown for job {job_id}")

    def wait_done(self, job_id: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in FINAL_STATES:
                return state
            time.sleep(0.5)
        self.slurm("scancel", job_id)
        raise AssertionError(f"job {job_id} still {state} after {timeout} s")


@pytest.fixture(scope="module")
def two_node_cluster(moto_server: str) -> Iterator[SlurmCluster]:
    """A 2-static-node local UltraCluster (real slurmctld + 2 slurmd), torn down afterwards. Its nodes
    are EC2 instances in the session's moto."""
    home = Path(tempfile.mkdtemp(prefix="uc-training-", dir="/tmp"))
    home.chmod(0o755)
    env = {**os.environ, **CLUSTER_ENV, "LOCAL_ULTRACLUSTER_HOME": str(home), "AWS_ENDPOINT_URL": moto_server,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    (home / "keys").mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / "keys" / "training-test")],
                   check=True)
    spec = {"name": "training-2n", "region": "us-east-1", "head_instance_type": "c5.4xlarge",
            "key_name": "training-test",
            "queues": [{"name": "compute1", "compute_resources": [
                {"name": "trn1", "instance_type": "trn1.32xlarge", "min_count": 2, "max_count": 2}]}],
            "mount_dirs": ["/fsx"], "accounting": False, "scaledown_idletime_min": 10.0,
            "faults": {"boot_delay": 1.0}}
    cluster_dir = home / "clusters" / spec["name"]
    cluster_dir.mkdir(parents=True)
    (cluster_dir / "spec.json").write_text(json.dumps(spec))
    try:
        done = subprocess.run([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", "provision",
                               str(cluster_dir / "spec.json"), str(cluster_dir)],
                              env=env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        runtime = json.loads(done.stdout)
        yield SlurmCluster(dir=cluster_dir, runtime=runtime, fsx=Path(runtime["shared_dirs"]["/fsx"]))
    finally:
        subprocess.run([str(LOCALCLUSTER_PYTHON), "-m", "localcluster.runtime", "stop-everything", str(home)],
                       env=env, capture_output=True, timeout=180)
        leftovers = processes_mentioning(str(home))
        shutil.rmtree(home, ignore_errors=True)
        assert leftovers == [], leftovers


@pytest.fixture
def job_dir(two_node_cluster: SlurmCluster, request: pytest.FixtureRequest) -> tuple[Path, str]:
    """A job directory on /fsx holding the training code, as the product lays it out."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-")
    host_dir = two_node_cluster.fsx / "jobs" / name
    shutil.copytree(TRAINING_DIR, host_dir, ignore=shutil.ignore_patterns("__pycache__"))
    return host_dir, f"/fsx/jobs/{name}"


def submit(cluster: SlurmCluster, job_dir: tuple[Path, str], data_dir: Path | str, user: str | None = None,
           **knobs: str) -> str:
    _, inside = job_dir
    exports = {**TINY_ENV, "DATA_DIR": str(data_dir), "OUTPUT_ROOT": inside,
               "COMPILE_CACHE_DIR": f"{inside}/compile_cache", "TRAINING_PYTHON": str(TRAINING_PYTHON), **knobs}
    export_arg = "ALL," + ",".join(f"{k}={v}" for k, v in exports.items())
    out = cluster.slurm("sbatch", "--exclusive", "--nodes", "2", "--chdir", inside,
                        "--output", f"{inside}/slurm-%j.out", "--export", export_arg,
                        "--wrap", f"{SRUN} {inside}/run_dp_bert_large_hf_pretrain_bf16_s128.sh", user=user)
    assert out.startswith("Submitted batch job "), out
    return out.split()[-1]


def slurm_log(job_dir: tuple[Path, str], job_id: str) -> str:
    path = job_dir[0] / f"slurm-{job_id}.out"
    return path.read_text() if path.exists() else ""


def host_path(cluster: SlurmCluster, inside: Path) -> Path:
    return cluster.fsx / inside.relative_to("/fsx")


def test_sbatch_two_nodes_loss_falls_and_results_validate(two_node_cluster, job_dir, data_dir):
    job_id = submit(two_node_cluster, job_dir, data_dir, MAX_STEPS="40", GRAD_ACCUM_USTEPS="2")
    assert two_node_cluster.wait_done(job_id) == "COMPLETED", slurm_log(job_dir, job_id)[-3000:]
    log = slurm_log(job_dir, job_id)

    nodes = [n["name"] for n in two_node_cluster.runtime["nodes"]]
    infos = sorted(line for line in log.splitlines() if line.startswith("UC_INFO"))
    assert [f"host={n}" in info for n, info in zip(nodes, infos)] == [True, True]
    assert all(f"master={nodes[0]}:" in info for info in infos)  # first host of the node list

    progress = progress_lines(log)
    assert [p.step for p in progress] == list(range(1, 41))
    assert sum(p.loss for p in progress[-5:]) / 5 < sum(p.loss for p in progress[:5]) / 5 - 1.0
    results_file = host_path(two_node_cluster, results_path(log))
    assert results_file == job_dir[0] / f"output_{job_id}" / "results.json"
    results = json.loads(results_file.read_text())
    validate_results(results)
    assert results["results"]["parameters"]["World size"] == 2
    assert results["results"]["parameters"]["Environment variables"]["SLURM_JOB_ID"] == job_id
    assert metric_values(results, "Sequences processed") == [16 * 40]
    assert sorted(p.name for p in (job_dir[0] / f"output_{job_id}").glob("log_ph1_bf16_*")) == \
        ["log_ph1_bf16_0_2", "log_ph1_bf16_1_2"]


def test_sbatch_strong_and_weak_scaling_global_batch(two_node_cluster, job_dir, data_dir):
    for mode, accum, global_batch in (("strong", 2, 32), ("weak", 4, 64)):
        job_id = submit(two_node_cluster, job_dir, data_dir, MAX_STEPS="3", GRAD_ACCUM_USTEPS="4",
                        SCALING_MODE=mode)
        assert two_node_cluster.wait_done(job_id) == "COMPLETED", slurm_log(job_dir, job_id)[-3000:]
        results = json.loads(host_path(two_node_cluster, results_path(slurm_log(job_dir, job_id))).read_text())
        validate_results(results)
        params = results["results"]["parameters"]
        assert (params["Gradient accumulation microsteps"], params["Global batch size"]) == (accum, global_batch)
        assert metric_values(results, "Sequences processed") == [global_batch * 3]


def test_scancel_then_resubmit_resumes_without_repeating_steps(two_node_cluster, job_dir, data_dir):
    first = submit(two_node_cluster, job_dir, data_dir, MAX_STEPS="40", GRAD_ACCUM_USTEPS="2", STEPS_PER_CKPT="10")
    deadline = time.monotonic() + 240
    while not any(p.step >= 22 for p in progress_lines(slurm_log(job_dir, first))):
        assert time.monotonic() < deadline, slurm_log(job_dir, first)[-3000:]
        assert two_node_cluster.job_field(first, "JobState") in {"PENDING", "CONFIGURING", "RUNNING"}
        time.sleep(0.5)
    two_node_cluster.slurm("scancel", first)
    assert two_node_cluster.wait_done(first) == "CANCELLED"
    killed_log = slurm_log(job_dir, first)
    assert "UC_RESULTS" not in killed_log
    deadline = time.monotonic() + 60
    while processes_mentioning(f"{job_dir[1]}/output_{first} ") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(f"{job_dir[1]}/output_{first} ") == []  # no worker outlives the cancelled job

    second = submit(two_node_cluster, job_dir, data_dir, MAX_STEPS="40", GRAD_ACCUM_USTEPS="2", STEPS_PER_CKPT="10",
                    RESUME_DIR=f"{job_dir[1]}/output_{first}")
    assert two_node_cluster.wait_done(second) == "COMPLETED", slurm_log(job_dir, second)[-3000:]
    log = slurm_log(job_dir, second)
    assert f"resuming from {job_dir[1]}/output_{first}/checkpoints/ckpt_20.pt at step 20" in log
    resumed = progress_lines(log)
    assert [p.step for p in resumed] == list(range(21, 41))
    assert resumed[0].loss < progress_lines(killed_log)[0].loss - 0.5
    results = json.loads(host_path(two_node_cluster, results_path(log)).read_text())
    assert results["results"]["parameters"]["Start step"] == 20


@pytest.mark.parametrize("knobs, expected", [
    ({"MODEL_SIZE": "huge"}, "unknown MODEL_SIZE 'huge'"),
    ({"SCALING_MODE": "strong", "GRAD_ACCUM_USTEPS": "3"}, "GRAD_ACCUM_USTEPS=3 is not divisible by 2 nodes"),
])
def test_sbatch_bad_input_fails_the_job_before_launch(two_node_cluster, job_dir, data_dir, knobs, expected):
    job_id = submit(two_node_cluster, job_dir, data_dir, MAX_STEPS="5", **knobs)
    assert two_node_cluster.wait_done(job_id) == "FAILED", slurm_log(job_dir, job_id)
    assert two_node_cluster.job_field(job_id, "ExitCode") == "2:0"
    errors = [line for line in slurm_log(job_dir, job_id).splitlines() if line.startswith("UC_ERROR ")]
    assert len(errors) == 2 and all(expected in e for e in errors)  # each node refuses
    assert not (job_dir[0] / f"output_{job_id}").exists()


def test_sbatch_as_the_cluster_user_with_data_in_shared_storage(two_node_cluster, job_dir, data_dir):
    # The product's jobs run as the cluster user, with the dataset untarred on shared storage.
    user = two_node_cluster.runtime["ssh_user"]
    host_dir, inside = job_dir
    shutil.copytree(data_dir, host_dir / "data")
    subprocess.run(["chown", "-R", f"{user}:", str(host_dir)], check=True)
    job_id = submit(two_node_cluster, job_dir, f"{inside}/data", user=user, MAX_STEPS="4", GRAD_ACCUM_USTEPS="2")
    assert two_node_cluster.wait_done(job_id) == "COMPLETED", slurm_log(job_dir, job_id)[-3000:]
    assert two_node_cluster.job_field(job_id, "UserId").startswith(f"{user}(")
    log = slurm_log(job_dir, job_id)
    assert [p.step for p in progress_lines(log)] == [1, 2, 3, 4]
    results_file = host_path(two_node_cluster, results_path(log))
    validate_results(json.loads(results_file.read_text()))
    assert results_file.stat().st_uid == (host_dir / "data").stat().st_uid  # written by the cluster user


def test_sbatch_a_trn1_job_gets_the_neuron_environment_on_every_node(two_node_cluster, job_dir):
    """The Trn1 path through Slurm: NEURON_DEVICE_GLOB points at stand-in devices on shared storage, a
    fake training Python records its environment per node, a `sysctl` stand-in on PATH records the
    port reservation (the machine's own settings are never touched)."""
    host_dir, inside = job_dir
    for name in ("dev", "bin", "data", "seen"):
        (host_dir / name).mkdir()
    for n in (0, 1):
        (host_dir / "dev" / f"neuron{n}").touch()
    for n in range(8):  # one file per worker: 2 nodes x 2 devices x 2 NeuronCores
        (host_dir / "data" / f"part_training_{n}.hdf5").touch()
    (host_dir / "bin" / "sysctl").write_text(
        f'#!/bin/sh\necho "$(hostname) $*" >> {inside}/seen/sysctl\n[ "$1" = -n ] && echo 8000\nexit 0\n')
    (host_dir / "bin" / "python").write_text(f'#!/bin/sh\nenv > {inside}/seen/env-$SLURM_NODEID\n')
    (host_dir / "bin" / "neuronx-cc").write_text("#!/bin/sh\nexit 0\n")  # checked for, never run here
    for tool in ("sysctl", "python", "neuronx-cc"):
        (host_dir / "bin" / tool).chmod(0o755)

    job_id = submit(two_node_cluster, job_dir, f"{inside}/data", TRAINING_PYTHON=f"{inside}/bin/python",
                    NEURON_DEVICE_GLOB=f"{inside}/dev/neuron*", NEURON_CC_FLAGS="--verbose=35",
                    PATH=f"{inside}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    assert two_node_cluster.wait_done(job_id) == "COMPLETED", slurm_log(job_dir, job_id)[-3000:]

    for node in (0, 1):
        launched = dict(line.split("=", 1) for line in (host_dir / "seen" / f"env-{node}").read_text().splitlines()
                        if "=" in line)
        assert {k: launched.get(k) for k in ("NEURON_RT_EXEC_TIMEOUT", "BUCKET_CAP_MB", "XLA_TRANSFER_SEED_ASYNC",
                                             "FI_PROVIDER", "NEURON_CC_FLAGS")} == {
            "NEURON_RT_EXEC_TIMEOUT": "600", "BUCKET_CAP_MB": "512", "XLA_TRANSFER_SEED_ASYNC": "1",
            "FI_PROVIDER": "efa", "NEURON_CC_FLAGS": "--model-type transformer --retry_failed_compilation --verbose=35"}
        assert "XLA_DOWNCAST_BF16" not in launched
    writes = [line.split(" ", 1)[1] for line in (host_dir / "seen" / "sysctl").read_text().splitlines() if " -w " in line]
    assert writes == ["-q -w net.ipv4.ip_local_reserved_ports=8000,48620"] * 2  # on each node
