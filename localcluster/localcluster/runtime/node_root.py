"""What a ParallelCluster 3.16 node has and this host does not: the twin's layers.

Each layer is a directory tree laid over the host's own directories inside the nodes' mount
namespaces only (overlayfs, `scripts/ns-exec.sh`), so the host keeps its own packages and files:
- common (head and compute nodes): Slurm's client commands under /opt/slurm/bin, on a login shell's
  PATH only through /etc/profile.d/slurm.sh; Debian's /usr/bin Slurm commands hidden (whiteouts);
  passwordless sudo for the OS's default user (/etc/sudoers.d); the EFA installer's fi_info in
  /opt/amazon/efa/bin, a stand-in (efa_tools.py).
- compute: the Neuron tools (/opt/aws/neuron/bin) and the Neuron venv (/opt/aws_neuron_venv_pytorch)
  that include/cluster/on_node_configured.sh installs there, with stand-ins where the real tool
  needs Neuron devices or the Neuron repositories (neuron_tools.py).
Sources of each value: docs/local-cluster.md, "Fidelity".
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import efa_tools, neuron_tools
from ..spec import default_user
from .errors import RuntimeProvisionError
from .paths import ClusterPaths

__all__ = ["SLURM_PREFIX", "build", "default_user", "overlay_args", "slurm_bin"]

# aws-parallelcluster-cookbook: aws-parallelcluster-slurm/attributes/slurm_attributes.rb (install_dir).
SLURM_PREFIX = "/opt/slurm"
# Debian's slurm-client commands; ParallelCluster has the same set in /opt/slurm/bin.
SLURM_CLIENT_COMMANDS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
                         "sdiag", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")
# Host directories the layers are laid over, in mount order.
OVERLAID = ("/usr/bin", "/opt", "/etc/profile.d", "/etc/sudoers.d")
# The cookbook's aws-parallelcluster-slurm/templates/default/slurm/head_node/slurm.sh.erb.
SLURM_PROFILE = f"""#
# slurm.sh:
#   Setup slurm environment variables
#

PATH=$PATH:{SLURM_PREFIX}/bin
MANPATH=$MANPATH:{SLURM_PREFIX}/share/man

export PATH MANPATH
"""


def slurm_bin(paths: ClusterPaths) -> Path:
    """/opt/slurm/bin as the host sees it: the runtime runs Slurm's commands from here, on the host
    and inside the nodes alike (Debian's /usr/bin copies are hidden there)."""
    return paths.node_layer("common") / SLURM_PREFIX.lstrip("/") / "bin"


def sudoers_text(user: str) -> str:
    # What cloud-init's default_user (sudo: "ALL=(ALL) NOPASSWD:ALL") writes on ParallelCluster's AMIs.
    return f"\n# User rules for {user}\n{user} ALL=(ALL) NOPASSWD:ALL\n\n"


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _whiteout(path: Path) -> None:
    """An overlayfs whiteout: the name does not exist in the merged directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))


def build_common(paths: ClusterPaths, user: str, head: dict, nodes: list[dict]) -> None:
    layer = paths.node_layer("common")
    bin_dir = slurm_bin(paths)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for command in SLURM_CLIENT_COMMANDS:
        source = Path("/usr/bin") / command
        if not source.is_file():
            raise RuntimeProvisionError(f"{source} missing: install Debian's slurm-client (make setup)")
        shutil.copy2(source, bin_dir / command)
        _whiteout(layer / "usr" / "bin" / command)
    _write(layer / "etc" / "profile.d" / "slurm.sh", SLURM_PROFILE, 0o644)
    if not Path("/etc/sudoers.d").is_dir() or not shutil.which("sudo"):
        raise RuntimeProvisionError("sudo is not installed (make setup): nodes grant the default user sudo")
    _write(layer / "etc" / "sudoers.d" / "90-cloud-init-users", sudoers_text(user), 0o440)
    efa_tools.install(layer, paths, head, nodes)
    for directory in [layer, *layer.rglob("*")]:
        if directory.is_dir():
            directory.chmod(0o755)


def build_compute(paths: ClusterPaths, nodes: list[dict]) -> None:
    layer = paths.node_layer("compute")
    neuron_tools.install(layer, paths, nodes)
    for directory in [layer, *layer.rglob("*")]:
        if directory.is_dir():
            directory.chmod(0o755)


def build(paths: ClusterPaths, user: str, head: dict, nodes: list[dict]) -> None:
    """``head``, ``nodes``: runtime.json's head_node and nodes."""
    build_common(paths, user, head, nodes)
    build_compute(paths, nodes)


def overlay_args(paths: ClusterPaths, role: str) -> list[str]:
    """ns-exec.sh arguments `+LOWER[:LOWER...]=DIR`: the role's layers over each host directory."""
    layers = [paths.node_layer(role)] if role == "compute" else []
    layers.append(paths.node_layer("common"))
    args = []
    for target in OVERLAID:
        lowers = [str(layer / target.lstrip("/")) for layer in layers if (layer / target.lstrip("/")).is_dir()]
        if lowers:
            args.append("+" + ":".join(lowers) + "=" + target)
    if role == "compute":
        args.append(neuron_tools.venv_overlay_arg(paths))
    return args
