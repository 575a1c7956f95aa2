"""The compute nodes' Neuron tools at their real paths, as stand-ins.

Real nodes (include/cluster/on_node_configured.sh): aws-neuronx-tools puts neuron-ls and neuron-top in
/opt/aws/neuron/bin; the Neuron venv /opt/aws_neuron_venv_pytorch holds neuronx-cc (pip package) and
neuron_parallel_compile (torch-neuronx). None can run here: neuron-ls needs Neuron devices, the
compiler and torch-neuronx come from Neuron's own repositories. The stand-ins keep their names, paths
and the contract the pipeline relies on: neuron_parallel_compile runs the command once with
NEURON_EXTRACT_GRAPHS_ONLY=1 and then calls neuronx-cc by name (found on PATH or not, as the real one).

The nodes' Neuron venv is the local training environment (LOCAL_UC_TRAINING_VENV) seen at the real
path, with the two compiler stand-ins added to its bin/. neuron-ls lists the instance type's devices,
one fewer where the `neuron-unhealthy` fault holds (node_faults.py), as a failed device drops out.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..instance_types import neuron_devices
from . import node_faults
from .paths import ClusterPaths

NEURON_BIN = "/opt/aws/neuron/bin"
NEURON_VENV = "/opt/aws_neuron_venv_pytorch"
STAND_IN_VERSION = "0.0.0+local-ultracluster-stand-in"


def training_venv(paths: ClusterPaths) -> str | None:
    """The venv the nodes see as their Neuron venv (None: one with the compiler stand-ins only), as
    provision found it in LOCAL_UC_TRAINING_VENV; nodes booted later (ResumeProgram runs without the
    CLI's environment) read it back from the cluster."""
    recorded = paths.root / "node" / "neuron-venv-base"
    if recorded.exists():
        return recorded.read_text().strip() or None
    return None


def record_training_venv(paths: ClusterPaths) -> None:
    base = os.environ.get("LOCAL_UC_TRAINING_VENV") or ""
    target = paths.root / "node" / "neuron-venv-base"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(str(Path(base).resolve()) if base else "")


def _neuron_ls(paths: ClusterPaths, nodes: list[dict]) -> str:
    devices = {n["name"]: (n["instance_type"], neuron_devices(n["instance_type"])) for n in nodes}
    return f"""#!/bin/bash
# local UltraCluster stand-in for neuron-ls (aws-neuronx-tools): a real node's devices, from its
# instance type; one fewer where the neuron-unhealthy fault holds.
{node_faults.shell_devices(paths, "neuron-unhealthy", devices)}
if [ "$devices" -eq 0 ]; then
    echo "neuron-ls: no Neuron devices found on $node ($type)" >&2
    exit 1
fi
if [ "${{1:-}}" = --json-output ] || [ "${{1:-}}" = -j ]; then
    sep=""; printf '['
    for ((i = 0; i < devices; i++)); do
        printf '%s{{"neuron_device": %d, "bdf": "%02x:1e.0", "nc_count": 2, "memory_size": 34359738368}}' \\
            "$sep" "$i" "$((16 + i))"
        sep=", "
    done
    printf ']\\n'
    exit 0
fi
echo "instance-type: $type"
echo "+--------+--------+--------+---------+"
echo "| NEURON | NEURON | NEURON |   PCI   |"
echo "| DEVICE | CORES  | MEMORY |   BDF   |"
echo "+--------+--------+--------+---------+"
for ((i = 0; i < devices; i++)); do
    printf '| %-6d | 2      | 32 GB  | %02x:1e.0 |\\n' "$i" "$((16 + i))"
done
echo "+--------+--------+--------+---------+"
"""


NEURON_TOP = """#!/bin/sh
# local UltraCluster stand-in for neuron-top (aws-neuronx-tools): there are no devices to watch.
echo "neuron-top: no Neuron devices on $(hostname) (local UltraCluster stand-in)" >&2
exit 1
"""

NEURONX_CC = f"""#!/bin/sh
# local UltraCluster stand-in for neuronx-cc (pip package from Neuron's repository).
if [ "${{1:-}}" = --version ]; then echo "NeuronX Compiler version {STAND_IN_VERSION}"; exit 0; fi
echo "neuronx-cc (local UltraCluster stand-in): no NEFF is built here" >&2
exit 0
"""

# torch-neuronx's neuron_parallel_compile: a trial run that only extracts graphs, then the
# compiler on each graph (called by name, so it must be on PATH).
NEURON_PARALLEL_COMPILE = """#!/bin/bash
# local UltraCluster stand-in for neuron_parallel_compile (torch-neuronx).
[ "$#" -gt 0 ] || { echo "usage: neuron_parallel_compile <run command>" >&2; exit 2; }
NEURON_EXTRACT_GRAPHS_ONLY=1 "$@" || exit $?
neuronx-cc --version > /dev/null || exit $?
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def venv_additions(paths: ClusterPaths) -> Path:
    return paths.node_layer("compute-venv")


def install(layer: Path, paths: ClusterPaths, nodes: list[dict]) -> None:
    """Write the stand-ins into the compute layer (and the Neuron venv's additions)."""
    tools = layer / NEURON_BIN.lstrip("/")
    _write(tools / "neuron-ls", _neuron_ls(paths, nodes))
    _write(tools / "neuron-top", NEURON_TOP)
    # on_node_configured.sh writes this profile script on every compute node.
    (layer / "etc" / "profile.d").mkdir(parents=True, exist_ok=True)
    (layer / "etc" / "profile.d" / "neuron.sh").write_text(f"export PATH={NEURON_BIN}:$PATH\n")
    (layer / NEURON_VENV.lstrip("/")).mkdir(parents=True, exist_ok=True)   # the venv's mount point
    additions = venv_additions(paths)
    _write(additions / "bin" / "neuronx-cc", NEURONX_CC)
    _write(additions / "bin" / "neuron_parallel_compile", NEURON_PARALLEL_COMPILE)
    for directory in (additions, additions / "bin"):
        directory.chmod(0o755)
    record_training_venv(paths)


def venv_overlay_arg(paths: ClusterPaths) -> str:
    """ns-exec.sh argument mounting the Neuron venv: the training venv with the stand-ins on top."""
    base = training_venv(paths)
    if base is None:
        return f"{venv_additions(paths)}={NEURON_VENV}"
    # Not laid over the mount point (inside /opt's overlay): overlayfs stacks at most two deep.
    return f"@{venv_additions(paths)}:{base}={NEURON_VENV}"
