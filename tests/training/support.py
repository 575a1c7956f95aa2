"""Helpers for the training tests: run the real run script and program, read what they wrote.

The training code runs in its own venv (.venvs/training); tests reach it only through binaries.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures_localcluster import free_port, processes_mentioning  # noqa: F401 - shared helpers, re-exported

REPO = Path(__file__).resolve().parents[2]
TRAINING_DIR = REPO / "include" / "training"
RUN_SCRIPT = TRAINING_DIR / "run_dp_bert_large_hf_pretrain_bf16_s128.sh"
SCHEMA = TRAINING_DIR / "results.schema.json"
TRAINING_PYTHON = Path(os.environ.get("TRAINING_PYTHON", REPO / ".venvs" / "training" / "bin" / "python"))
DATASET_NAME = "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"
PROGRESS = re.compile(
    r"^UC_PROGRESS step=(\d+) total=(\d+) loss=(\d+\.\d+) lr=(\d+\.\d+) throughput=(\d+\.\d+) eta_s=(\d+)$")

# A tiny run that finishes in well under a minute on 2 shared cores.
TINY_ENV = {
    "MODEL_SIZE": "tiny", "BATCH_SIZE": "8", "WARMUP_STEPS": "5", "LR": "0.001",
    "TORCH_NUM_THREADS": "1", "STEPS_PER_CKPT": "10", "NUM_CKPTS_TO_KEEP": "2",
}


@dataclass
class Progress:
    step: int
    total: int
    loss: float
    lr: float
    throughput: float
    eta_s: int


def progress_lines(text: str) -> list[Progress]:
    found = []
    for line in text.splitlines():
        match = PROGRESS.match(line)
        if match:
            s, t, loss, lr, thr, eta = match.groups()
            found.append(Progress(int(s), int(t), float(loss), float(lr), float(thr), int(eta)))
    return found


def results_path(text: str) -> Path:
    lines = [line for line in text.splitlines() if line.startswith("UC_RESULTS ")]
    assert len(lines) == 1, f"expected one UC_RESULTS line in:\n{text[-3000:]}"
    return Path(lines[0].split(" ", 1)[1])


def metric_values(results: dict, name: str) -> list:
    return [m["MeasuredValue"] for m in results["results"]["metrics"] if m["MetricName"] == name]


def validate_results(results: dict) -> None:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(results, schema, format_checker=jsonschema.FormatChecker())


def slurm_env(node_count: int, node_id: int, job_id: str) -> dict[str, str]:
    """What srun gives each task of a one-task-per-node job."""
    return {"SLURM_NTASKS": str(node_count), "SLURM_NODEID": str(node_id), "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NODELIST": f"node[1-{node_count}]" if node_count > 1 else "node1"}


def base_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "NEURON_"))}
    env.update(TRAINING_PYTHON=str(TRAINING_PYTHON), **overrides)
    return env


def run_script_once(env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(RUN_SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


class EmulatedNodes:
    """The run script started once per 'node' with the Slurm variables srun would set.

    Stands in for `srun` on a machine without the cluster: every node rendezvouses on
    127.0.0.1 (MASTER_ADDR) exactly as the nodes of a real job do on their first host.
    Each node runs in its own process group so a test can kill a whole node like Slurm does.
    """

    def __init__(self, node_count: int, job_id: str, env: dict[str, str], workdir: Path):
        self.node_count, self.job_id, self.workdir = node_count, job_id, workdir
        port = str(free_port())
        self.outputs = [workdir / f"node{n}-{job_id}.out" for n in range(node_count)]
        self.processes = []
        for node_id in range(node_count):
            node_env = {**env, **slurm_env(node_count, node_id, job_id),
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            with self.outputs[node_id].open("w") as out:
                self.processes.append(subprocess.Popen(
                    ["bash", str(RUN_SCRIPT)], env=node_env, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True))

    def wait(self, timeout: float = 240) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(1, deadline - time.monotonic())) for p in self.processes]
        except subprocess.TimeoutExpired as exc:
            self.kill()
            tails = "\n".join(f"--- node {n}:\n{out.read_text()[-2000:]}" for n, out in enumerate(self.outputs))
            raise AssertionError(f"the nodes did not finish in {timeout:.0f} s\n{tails}") from exc

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=30)

    def output(self, node_id: int = 0) -> str:
        return self.outputs[node_id].read_text()


def run_emulated(node_count: int, job_id: str, env: dict[str, str], workdir: Path,
                 timeout: float = 240) -> tuple[list[int], str]:
    nodes = EmulatedNodes(node_count, job_id, env, workdir)
    codes = nodes.wait(timeout)
    return codes, nodes.output(0)
