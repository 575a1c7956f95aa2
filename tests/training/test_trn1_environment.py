"""The Neuron environment the run script gives a Trn1 job, checked on this machine.

NEURON_DEVICE_GLOB points the script at stand-in devices (files named neuron0, neuron1), so it takes
its Trn1 path; a fake training Python records the environment it was launched with, and a `sysctl`
stand-in on PATH records what the script asks of the kernel (the machine's own settings are never
touched).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.support import TINY_ENV, base_env, run_script_once, slurm_env

pytestmark = pytest.mark.training

NEURON_VARIABLES = {"NEURON_RT_EXEC_TIMEOUT": "600", "BUCKET_CAP_MB": "512", "XLA_TRANSFER_SEED_ASYNC": "1",
                    "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1", "FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1",
                    "FI_EFA_FORK_SAFE": "1", "MALLOC_ARENA_MAX": "64"}


def trn1_node(tmp_path: Path, reserved: str, sysctl_write_fails: bool = False, **knobs: str):
    devices = tmp_path / "dev"
    devices.mkdir()
    for n in (0, 1):
        (devices / f"neuron{n}").touch()
    tools = tmp_path / "bin"
    tools.mkdir()
    calls = tmp_path / "sysctl-calls"
    (tools / "sysctl").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        f'[ "$1" = -n ] && {{ echo "{reserved}"; exit 0; }}\n'
        f"exit {1 if sysctl_write_fails else 0}\n")
    # The Neuron venv's compiler, which the script checks for on a Trn1 node (it never runs here).
    (tools / "neuronx-cc").write_text("#!/bin/sh\nexit 0\n")
    seen = tmp_path / "launch-env"
    python = tmp_path / "fake-python"
    python.write_text(f'#!/bin/sh\nenv > "{seen}"\necho "$*" > "{seen}.args"\n')
    for tool in (tools / "sysctl", tools / "neuronx-cc", python):
        tool.chmod(0o755)
    data = tmp_path / "data"
    data.mkdir()
    for n in range(8):  # one file per worker: 2 devices x 2 NeuronCores x 2 nodes
        (data / f"part_training_{n}.hdf5").touch()
    env = {**base_env(), **TINY_ENV, **slurm_env(2, 0, "91"), "DATA_DIR": str(data),
           "OUTPUT_ROOT": str(tmp_path / "out"), "MASTER_ADDR": "127.0.0.1",
           "NEURON_DEVICE_GLOB": f"{devices}/neuron*", "TRAINING_PYTHON": str(python),
           "PATH": f"{tools}:{base_env()['PATH']}", **knobs}
    done = run_script_once(env)
    launched = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line) \
        if seen.exists() else None
    return done, launched, calls.read_text().splitlines() if calls.exists() else []


def test_a_trn1_job_gets_the_samples_neuron_environment_and_the_users_compiler_flags(tmp_path):
    done, launched, sysctl = trn1_node(tmp_path, reserved="8000-8010", NEURON_CC_FLAGS="--verbose=35 -O1")

    assert done.returncode == 0, done.stdout + done.stderr
    assert {k: launched.get(k) for k in NEURON_VARIABLES} == NEURON_VARIABLES
    # The user's flags (extra_job_env) add to ours instead of replacing them.
    assert launched["NEURON_CC_FLAGS"] == "--model-type transformer --retry_failed_compilation --verbose=35 -O1"
    assert launched["NEURON_COMPILE_CACHE_URL"] == str(tmp_path / "out" / "compile_cache")
    assert "XLA_DOWNCAST_BF16" not in launched and "XLA_USE_BF16" not in launched
    assert "workers_per_node=4" in done.stdout  # two NeuronCores per device
    # The port is added to what the node reserves already.
    assert sysctl == ["-n net.ipv4.ip_local_reserved_ports", "-q -w net.ipv4.ip_local_reserved_ports=8000-8010,48620"]


def test_without_user_flags_the_job_compiles_for_transformers_and_retries_failed_graphs(tmp_path):
    done, launched, sysctl = trn1_node(tmp_path, reserved="48620", NEURON_CC_FLAGS="")

    assert done.returncode == 0, done.stdout + done.stderr
    assert launched["NEURON_CC_FLAGS"] == "--model-type transformer --retry_failed_compilation"
    assert sysctl == ["-n net.ipv4.ip_local_reserved_ports"]  # already reserved: nothing written


def test_a_port_that_cannot_be_reserved_fails_the_job_before_launch(tmp_path):
    done, launched, _ = trn1_node(tmp_path, reserved="", sysctl_write_fails=True)

    assert done.returncode == 2
    [error] = [line for line in done.stdout.splitlines() if line.startswith("UC_ERROR ")]
    assert "cannot reserve local port 48620" in error and "net.ipv4.ip_local_reserved_ports=48620" in error
    assert launched is None and not (tmp_path / "out").exists()


def test_the_retired_bf16_variables_are_refused_by_the_program(training_python, data_dir, tmp_path):
    """XLA_USE_BF16 / XLA_DOWNCAST_BF16 (read up to Neuron 2.24) fail the run instead of being ignored."""
    import subprocess

    program = Path(__file__).resolve().parents[2] / "include" / "training" / "dp_bert_large_hf_pretrain_hdf5.py"
    done = subprocess.run([str(training_python), str(program), "--data_dir", str(data_dir), "--output_dir",
                           str(tmp_path / "out"), "--model_size", "tiny", "--max_steps", "1"],
                          env={**base_env(), "XLA_DOWNCAST_BF16": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout.startswith("UC_ERROR XLA_DOWNCAST_BF16 set: Neuron 2.24 was the last release to read it")
