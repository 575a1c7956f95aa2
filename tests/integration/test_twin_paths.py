"""What the twin (a local cluster shaped like a ParallelCluster 3.16 node) makes the product prove, on a
REAL local UltraCluster: no remote command needs a login shell's PATH, and a compile job finds the
Neuron compiler. tests/localcluster/test_twin.py holds the twin's own properties.

Run (root; about a minute): .venvs/airflow/bin/python -m pytest -q tests/integration/test_twin_paths.py
"""

from __future__ import annotations

import pytest

from tests.fixtures_localcluster import wait_until_gone
from tests.integration.test_auto_resume_slurm import DATA_DIR, REPO, RUNTIME_READY
from tests.integration.test_slurm_side import ctx, make_cluster, wait_for_fleet
from tests.remote_command_samples import samples

pytestmark = [pytest.mark.localcluster, pytest.mark.skipif(
    not RUNTIME_READY, reason="needs root, Slurm, sshd, .venvs/training and the local dataset")]

NEURON_VENV_BIN = "/opt/aws_neuron_venv_pytorch/bin"
NEURON_BIN = "/opt/aws/neuron/bin"


def test_every_remote_command_runs_in_a_non_login_shell(uc_home, uc_env, make_cluster_config, pcluster,
                                                        monkeypatch):
    from ultracluster import remote_commands as rc
    from ultracluster.hooks.head_node import HeadNodeHook
    from ultracluster.parsers.slurm import parse_sbatch, parse_wait_end

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, "nologin", {}, static=1)
    try:
        head = wait_for_fleet(cluster, num_nodes=1)["head_node"]
        hook = HeadNodeHook(head_node=head)
        # As on a real head node: Slurm only on a login shell's PATH (paramiko and asyncssh start none).
        bare = hook.run(rc.RemoteCommand(shell="sinfo", description="bare sinfo"))
        assert bare.exit_status == 127 and "command not found" in bare.stderr, bare
        login = hook.check(rc.RemoteCommand(shell="bash -lc 'command -v sinfo'", description="login sinfo"))
        assert login.stdout.strip() == rc.slurm_command("sinfo")

        job_dir = "/fsx/jobs/nologin"
        hook.check(rc.make_dirs(job_dir))
        first = hook.check(samples(job_dir)["sbatch"][0])
        job_id = parse_sbatch(first.stdout)
        ran = {}
        for name, commands in samples(job_dir, job_id, launcher_dirs=(NEURON_VENV_BIN, NEURON_BIN)).items():
            for command in commands:
                result = hook.run(command, timeout=60)
                ran.setdefault(name, result)  # a builder's first sample: the one the checks below read
                output = result.stdout + result.stderr
                assert result.exit_status != 127 and "command not found" not in output, (name, command.shell, output)
        # The head-node waits swallow a failing Slurm command and wait out their window: they must
        # have seen Slurm answer instead.
        assert parse_wait_end(ran["wait_job_end"].stderr).reason == "job-ended", ran["wait_job_end"]
        assert parse_wait_end(ran["wait_nodes_change"].stderr).reason == "changed", ran["wait_nodes_change"]
        assert ran["sinfo"].ok and "compute1" in ran["sinfo"].stdout
        assert ran["scontrol_show_job"].ok and f"JobId={job_id}" in ran["scontrol_show_job"].stdout
    finally:
        pcluster("delete-cluster", "-n", "nologin")
        wait_until_gone(uc_env, "nologin", timeout=120)


def test_the_compile_job_finds_the_neuron_compiler(uc_home, uc_env, make_cluster_config, pcluster, monkeypatch):
    """parallel_compile as the DAG runs it: the real run script under neuron_parallel_compile from the
    nodes' Neuron venv. The launcher calls neuronx-cc by name and the script checks for it first, so
    the job completes only if the job's PATH holds the venv's bin/."""
    from ultracluster.operators.slurm import SlurmJobOperator

    cluster = make_cluster(uc_env, make_cluster_config, pcluster, monkeypatch, uc_home, "compiler", {}, static=1)
    try:
        head = wait_for_fleet(cluster, num_nodes=1)["head_node"]
        env = {"MODEL_SIZE": "tiny", "BATCH_SIZE": "8", "GRAD_ACCUM_USTEPS": "1", "MAX_STEPS": "2",
               "COMPILE_STEPS": "2", "WARMUP_STEPS": "1", "TORCH_NUM_THREADS": "1", "SCALING_MODE": "strong",
               "DATA_DIR": str(DATA_DIR), "TRAINING_PYTHON": f"{NEURON_VENV_BIN}/python"}
        compile_op = SlurmJobOperator(task_id="parallel_compile", head_node=head, job_dir="/fsx/jobs/compiler",
                                      num_nodes=1, job_env=env, launcher="neuron_parallel_compile",
                                      training_files_dir=str(REPO / "include" / "training"), deferrable=False,
                                      poll_interval=1)
        compiled = compile_op.execute(ctx("parallel_compile", run_id="manual__compiler"))
        assert compiled["state"] == "COMPLETED", compiled
        assert compiled["launch"] == {"mode": "neuron_parallel_compile",
                                      "path": f"{NEURON_VENV_BIN}/neuron_parallel_compile"}
    finally:
        pcluster("delete-cluster", "-n", "compiler")
        wait_until_gone(uc_env, "compiler", timeout=120)
