"""Where each cluster keeps its state, in one place so every module agrees."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOME = "/var/lib/local-ultracluster"
SHORT_RUN_ROOT = "/run/local-uc"
# Inside each compute node's mount namespace the node's own spool dir is mounted here (short socket paths).
NODE_SPOOL_DIR = "/var/spool/slurmd"


def uc_home() -> Path:
    return Path(os.environ.get("LOCAL_ULTRACLUSTER_HOME", DEFAULT_HOME))


def ssh_port() -> int:
    return int(os.environ.get("LOCAL_UC_SSH_PORT", "2222"))


@dataclass(frozen=True)
class ClusterPaths:
    root: Path

    @property
    def home(self) -> Path:
        """LOCAL_ULTRACLUSTER_HOME: cluster_dir is <home>/clusters/<name>."""
        return self.root.parent.parent

    @property
    def runtime_json(self) -> Path:
        return self.root / "runtime.json"

    @property
    def spec_json(self) -> Path:
        return self.root / "spec.json"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm" / "slurm.conf"

    @property
    def slurm_daemon_conf(self) -> Path:
        """slurm.conf plus the address binding only the daemons may have (see slurmconf.py)."""
        return self.etc / "slurm" / "slurm-daemons.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurm" / "slurmdbd.conf"

    @property
    def hosts_file(self) -> Path:
        return self.etc / "hosts"

    @property
    def run(self) -> Path:
        """PID files and per-node state."""
        return self.root / "run"

    @property
    def nodes_state(self) -> Path:
        return self.run / "nodes"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def short_run(self) -> Path:
        """Unix socket paths are limited to 108 bytes, so sockets live in a short per-cluster dir."""
        digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:12]
        return Path(SHORT_RUN_ROOT) / digest

    @property
    def munge_socket(self) -> Path:
        return self.short_run / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "ssh"

    @property
    def shared_home(self) -> Path:
        """Bind-mounted at /home on every node of the cluster."""
        return self.root / "shared" / "home"

    def shared_mount(self, mount_dir: str) -> Path:
        """Backing dir of a SharedStorage MountDir such as /fsx."""
        return self.root / "shared" / ("mnt" + mount_dir.replace("/", "_"))

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def node_layer(self, role: str) -> Path:
        """A tree laid over the host's directories inside the nodes (node_root.py)."""
        return self.root / "node" / role

    def node_spool(self, node_name: str) -> Path:
        return self.spool / f"slurmd-{node_name}"

    def pid_file(self, daemon: str) -> Path:
        return self.run / f"{daemon}.pid"
